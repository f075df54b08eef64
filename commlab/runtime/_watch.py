"""The CPU backend's watch over waits inside kernels: a lost peer raises RankLostError
(``membership``) and a wait past the communicator's timeout CollectiveTimeoutError,
instead of spinning forever."""

from __future__ import annotations

from collections.abc import Callable

from commlab.errors import CollectiveTimeoutError
from commlab.runtime.membership import Membership


def peer_watch(members: Membership, timeout: float, where: Callable[[], tuple[str, int]]):
    """The check ``_interpreter.liveness`` runs for a wait inside a kernel; ``where()``
    gives the collective this rank last entered and its number (``("", 0)``: none)."""
    def watch(waited: float) -> None:
        op, n = where()
        members.check(f"a wait inside a kernel (the last collective entered: {op} #{n})"
                      if op else "a wait inside a kernel", op)
        if waited > timeout:
            raise CollectiveTimeoutError(
                f"rank {members.rank}: a wait inside a kernel got no signal within "
                f"{timeout:g} s; a peer is stuck or did not launch the same kernel; check "
                f"for a rank-dependent branch, or raise the limit with commlab.init(timeout=...)")
    return watch
