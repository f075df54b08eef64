"""The CPU backend's watch over waits inside kernels: a lost peer raises RankLostError
(``membership``), a wait past the timeout in force (the communicator's, or a torch
group's: ``_control.call_timeout``) CollectiveTimeoutError naming who is absent, instead
of spinning forever. The agreement asks the same members which peers are lost."""

from __future__ import annotations

from collections.abc import Callable

from commlab.errors import CollectiveTimeoutError
from commlab.runtime._control import ACTIVE, limit
from commlab.runtime.membership import Membership


class PeerWatch:
    """``watch(waited)`` raises for a lost member or a wait past the timeout in force;
    ``dead()`` lists the lost members; ``where()`` gives the collective this rank last
    entered and its number (``("", 0)``: none)."""

    def __init__(self, members: Membership, timeout: float,
                 where: Callable[[], tuple[str, int]]):
        self.members, self.timeout, self.where = members, timeout, where

    def dead(self) -> list[int]:
        return self.members.lost()

    def __call__(self, waited: float) -> None:
        op, n = self.where()
        self.members.check(f"a wait inside a kernel (the last collective entered: {op} #{n})"
                           if op else "a wait inside a kernel", op, call=n)
        t = limit(self.timeout)
        if waited > t:
            control = ACTIVE[0]
            absent = control.absent() if control is not None else ""
            left = self.members.departures(self.members.lost())
            if left:  # done with this call on its side: the signal was never sent
                absent = "; ".join(([absent] if absent else []) + left)
            raise CollectiveTimeoutError(
                f"rank {self.members.rank}: a wait inside a kernel got no signal within the "
                f"{t:g} s timeout; " + (f"{absent}; " if absent else "a peer is stuck or did "
                                        "not launch the same kernel; ")
                + "check for a rank-dependent branch, or raise the limit with "
                "commlab.init(timeout=...)")


def peer_watch(members: Membership, timeout: float,
               where: Callable[[], tuple[str, int]]) -> PeerWatch:
    """The check ``_interpreter.liveness`` runs for a wait inside a kernel."""
    return PeerWatch(members, timeout, where)
