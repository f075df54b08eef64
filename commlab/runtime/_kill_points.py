"""Named points of the recovery paths where a fault test may end this rank.

The seeded fault runs (``tests/test_elastic.py``) kill a rank *at* a named step of a
shrink or of a join (the newcomer's ``join.*``, a member's ``grow.*``) instead of after a
random delay, so every run reaches the state it names. ``reach(point)`` is one truth test of an
empty dict unless a test armed a point; an armed action runs once.
"""

from __future__ import annotations

from collections.abc import Callable

SHRINK_POINTS = (
    "shrink.arrive",     # before writing arrive: never counted in the decision
    "shrink.decided",    # in the decision, before confirming it: the round fails
    "shrink.confirmed",  # confirmed, then gone: lost in the new world (shrink again)
    "shrink.regroup",    # every member confirmed; gone while the new group connects
)
JOIN_POINTS = (
    "join.wait",     # newcomer, registered, waiting for admission: never admitted, or the
                     # grow that claimed it aborts (the world goes on unchanged)
    "join.map",      # newcomer, admitted, its heap published: the grow aborts everywhere
    "join.commit",   # newcomer, the verdict "go" taken, while the grown group connects
    "join.state",    # newcomer, between State.sync's two broadcasts
    "grow.arrive",   # member, before arriving: the members' RankLostError, no newcomer claimed
    "grow.ready",    # member, the newcomers' heaps mapped, before its ready: abort everywhere
    "grow.commit",   # member, the verdict "go" taken, while the grown group connects
    "grow.state",    # member, between State.sync's two broadcasts
)

_ARMED: dict[str, Callable[[], None]] = {}


def arm(point: str, action: Callable[[], None]) -> None:
    """Run ``action`` (e.g. SIGKILL this process) the next time ``point`` is reached."""
    if point not in SHRINK_POINTS + JOIN_POINTS:
        raise ValueError(f"kill point {point!r} is not one of "
                         f"{', '.join(SHRINK_POINTS + JOIN_POINTS)}")
    _ARMED[point] = action


def reach(point: str) -> None:
    """Called by the recovery paths at ``point``."""
    if _ARMED:
        action = _ARMED.pop(point, None)
        if action is not None:
            action()
