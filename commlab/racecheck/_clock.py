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


def acquired(history: list, threshold: int, clock: dict) -> dict:
    """The clock an acquire held at ``clock`` gets when it sees a flag at >= ``threshold``.

    ``history``: the flag's writes in the order they took effect, (value after, released
    clock or None, rank, writer component or None, epoch); component None is a write
    no atomic made (the host's, a plain store's), taken as ordered before the acquire.
    The acquire may read any write from the last one ordered before it on, so a spin
    wait synchronises with the earliest of those whose value meets its condition, and
    with the release sequence leading to it since the last decrease or plain write, not
    with later releases: a value already there gives no ordering with a later notify,
    however long after it the waiter looked."""
    start = 0
    for i in range(len(history) - 1, -1, -1):
        comp = history[i][3]
        if comp is None or covers(clock, comp, history[i][4]):
            start = i
            break
    j = next((i for i in range(start, len(history)) if history[i][0] >= threshold), None)
    out: dict = {}
    if j is None:
        return out
    i = j
    while i > 0 and history[i][3] is not None and history[i - 1][0] <= history[i][0]:
        i -= 1
    for h in history[i:j + 1]:
        join(out, h[1])
    return out
