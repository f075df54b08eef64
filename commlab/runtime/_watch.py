"""The CPU backend's watch over waits inside kernels: a dead peer or a wait past the
communicator's timeout raises instead of spinning forever (ranks are processes of one
host, so a peer's pid says whether it lives)."""

from __future__ import annotations

from commlab.errors import CollectiveTimeoutError
from commlab.runtime._bootstrap import World


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # zombie: dead
    except OSError:
        return False


def peer_watch(world: World, timeout: float, pids: list[int]):
    """The CPU backend's check for waits inside kernels (ranks are processes of one host):
    a dead peer, or a wait longer than the communicator's timeout, raises."""
    def watch(waited: float) -> None:
        dead = [r for r, p in enumerate(pids) if r != world.rank and not _alive(p)]
        if dead:
            raise CollectiveTimeoutError(
                f"rank {world.rank}: a wait inside a kernel cannot finish: rank(s) "
                f"{', '.join(map(str, dead))} died (pid {', '.join(str(pids[r]) for r in dead)});"
                f" restart the world")
        if waited > timeout:
            raise CollectiveTimeoutError(
                f"rank {world.rank}: a wait inside a kernel got no signal within {timeout:g} s;"
                f" a peer is stuck or did not launch the same kernel; check for a "
                f"rank-dependent branch, or raise the limit with commlab.init(timeout=...)")
    return watch
