"""The CPU backend's watch over waits inside kernels: a dead peer or a wait past the
timeout in force (the communicator's, or a torch group's: ``_control.call_timeout``)
raises instead of spinning forever (ranks are processes of one host, so a peer's pid says
whether it lives). The agreement asks the same watch which peers died."""

from __future__ import annotations

from commlab.errors import CollectiveTimeoutError
from commlab.runtime._bootstrap import World
from commlab.runtime._control import ACTIVE, limit


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # zombie: dead
    except OSError:
        return False


class PeerWatch:
    """``watch(waited)`` raises for a dead peer or a wait past the timeout in force;
    ``dead()`` lists the peers whose process ended."""

    def __init__(self, world: World, timeout: float, pids: list[int]):
        self.rank, self.timeout, self.pids = world.rank, timeout, pids

    def dead(self) -> list[int]:
        return [r for r, p in enumerate(self.pids) if r != self.rank and not _alive(p)]

    def __call__(self, waited: float) -> None:
        dead = self.dead()
        if dead:
            raise CollectiveTimeoutError(
                f"rank {self.rank}: a wait inside a kernel cannot finish: rank(s) "
                f"{', '.join(map(str, dead))} died (pid "
                f"{', '.join(str(self.pids[r]) for r in dead)}); restart the world")
        t = limit(self.timeout)
        if waited > t:
            control = ACTIVE[0]
            absent = control.absent() if control is not None else ""
            raise CollectiveTimeoutError(
                f"rank {self.rank}: a wait inside a kernel got no signal within the {t:g} s "
                f"timeout; " + (f"{absent}; " if absent else "a peer is stuck or did not "
                                "launch the same kernel; ")
                + "check for a rank-dependent branch, or raise the limit with "
                "commlab.init(timeout=...)")


def peer_watch(world: World, timeout: float, pids: list[int]) -> PeerWatch:
    """The CPU backend's check for waits inside kernels (ranks are processes of one host):
    a dead peer, or a wait longer than the timeout in force, raises."""
    return PeerWatch(world, timeout, pids)
