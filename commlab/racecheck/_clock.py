"""Vector clocks as dicts: component (rank, program) -> count; program -1 is the host."""

from __future__ import annotations


def join(a: dict, b: dict | None) -> dict:
    """``a`` raised to ``b`` component-wise (in place); returns ``a``."""
    if b:
        for k, v in b.items():
            if a.get(k, 0) < v:
                a[k] = v
    return a


def covers(clock: dict, comp, epoch: int) -> bool:
    """Whether an event at ``epoch`` of ``comp`` happened before a holder of ``clock``."""
    return clock.get(comp, 0) >= epoch


def acquired(history: list, threshold: int) -> dict:
    """The clock an acquire gets when it sees a flag at >= ``threshold``.

    ``history``: the flag's (value after, released clock or None) in the order they
    took effect. The acquire is ordered after the release that last made the flag
    cross the threshold and the release sequence leading to it since the last
    decrease (a reset), never after later releases: the result does not depend on
    how long after the crossing the acquire looked."""
    j = None
    for i in range(len(history) - 1, -1, -1):
        if history[i][0] >= threshold and (i == 0 or history[i - 1][0] < threshold):
            j = i
            break
    out: dict = {}
    if j is None:
        return out
    i = j
    while i > 0 and history[i - 1][0] <= history[i][0]:
        i -= 1
    for _, clock in history[i:j + 1]:
        join(out, clock)
    return out
