"""Online selection's rules for one key: its constants, its state, and rank 0's judgement.

``_adapt`` runs the protocol (the picks, the note, the C dispatch's budget); this module
holds what a key is and how rank 0 reads its samples: the typical cost of each
algorithm since the previous decision, a contender compared with the current
algorithm's calls next to its own, the burst and exploration plans (``_adapt``'s
docstring gives the schedule they fill).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

PERIOD = 50  # calls between decisions
# calls after a new key's probe at which rank 0 may leave `current`: a peer may still be
# finishing the probe's last call (its record incomplete) at the first
PROBE_DECISIONS = (1, 3, 6)
BURST = 6  # calls per algorithm in a burst period (as RUN)
# calls of one contender per steady exploration: SETTLE unsettled, then an even number
# settled, as calls may alternate fast and slow (one-shot's parity beside a loaded rank):
# an odd number reads one mode twice, the same one whenever the change starts it there
RUN = 6
SETTLE = 2  # calls from a change of algorithm on that still pay for it (the change's
#             waiting agreement, then the ranks' pipeline refilling: on 4 CPU ranks a
#             contender's second call after the change took ~10% over its steady ones)
WINDOW = 9  # samples per algorithm in a typical cost (``typical``)
TAIL = PERIOD // 2  # records rank 0 reads at a decision after a period of `current` only
SWITCH = 0.05  # another algorithm this much faster (typical cost) takes over
DRIFT = 0.20  # the current algorithm's typical cost moving this much starts a burst
HOPELESS = 2.0  # slower than the current by this factor: explored on the time budget
EXPLORE = 0.02  # exploring calls per call at most (a key's first period aside)
# steady explorations' time over `current`, per call of the key (in calls of `current`):
# together 1%, so that a key holding the best algorithm stays within ~1% of it
HOPELESS_TIME = 0.005  # HOPELESS algorithms' runs
EXPLORE_TIME = 0.005  # the others' runs, their two changes of algorithm included
SWITCH_COST = 1.0  # a change of algorithm (a waiting agreement), in calls of `current`
HINT_WAIT = 3  # decisions a hint's run may take to reach rank 0 (the one that plans it too)


@dataclass
class Key:
    algorithms: tuple[str, ...]
    current: str
    table: str
    tag: int  # this key's number on this communicator (the note's tag)
    calls: int = 0
    burst: tuple[str, ...] = ()  # the algorithms this period's burst measures
    per: int = BURST  # calls per algorithm in it (a new key's probe: 1)
    explore: str = ""  # the contender this period's steady run measures
    last: str = ""  # the algorithm the key's previous call ran
    explored: int = 0  # calls that ran another algorithm than `current` (first period aside)
    decided: int = 0  # rank 0's decisions taken (the others were skipped)
    # rank 0 only: measurements and what they led to
    # algorithm -> deque of (call, record, cost ns, calls since the key's change)
    samples: dict = field(default_factory=dict)
    fed: tuple = ("", 0)  # the algorithm of the last record fed, its calls since a change
    ratio: dict = field(default_factory=dict)  # algorithm -> last cost / current's
    chosen_level: float = 0.0  # the current algorithm's cost when it was chosen
    excess: float = 0.0  # HOPELESS explorations' time over `current`, in its calls
    near: float = 0.0  # the other steady explorations' time over it (changes included)
    rounds: int = 0  # steady explorations scheduled (which contender is next)
    deferred: bool = False  # a drift's burst waits until the budget allows it
    quiet: int = 0  # every rank: the decision point left out (the call rank 0's last
    #                 decision named, ``quiet_after``; 0: none)
    # a contender faster than the current's calls beside it but not than the period's:
    # run once more in the next period, where a second such paired reading switches to
    # it; judged at the first decision that has its run's records (GPUs: a decision
    # late), given up after HINT_WAIT decisions
    hint: str = ""
    hint_left: int = 0
    reads: dict = field(default_factory=dict)  # rank 0: a contender's paired readings
    confirming: set = field(default_factory=set)  # those whose second reading was planned
    history: list = field(default_factory=list)  # (call, algorithm, why) decisions
    budget: Any = None  # _fastcall.Budget: calls the C dispatch serves between picks


def explore_slots() -> tuple[int, int]:
    """The first and last slot of a period that a steady exploration's calls take (in
    its second half: a program that pauses every half period, as adapt_bench's blocks
    do, breaks no run)."""
    return PERIOD // 2 + 1, PERIOD // 2 + RUN


def calls_of(k: Key) -> int:
    """The key's calls so far, those the C dispatch served since its last pick included."""
    return k.calls + (k.budget.used if k.budget is not None else 0)


def typical(values) -> float:
    """A call's typical cost among ``values``: the mean of the middle 80% (from 5 values
    on, at least one dropped at each end), the median of fewer. A throughput: calls
    that alternate fast and slow (one-shot's call parity beside a loaded rank) cost
    their mean, where a median would pick one of the two."""
    v = sorted(values)
    if len(v) < 5:
        return statistics.median(v)
    cut = max(1, len(v) // 10)
    v = v[cut:-cut]
    return sum(v) / len(v)


def _fresh(k: Key, alg: str) -> list[tuple[int, int, int]]:
    """(record number, cost ns, calls since its key's change) of ``alg``'s samples fed
    since the previous decision; the unsettled ones (a change of algorithm and the call
    after it, which still pay for it) only where there is nothing else (a new key's
    probe: one call each)."""
    fresh = [(r, w, since) for c, r, w, since in k.samples.get(alg, ()) if c > k.calls - PERIOD]
    steady = [x for x in fresh if x[2] >= SETTLE]
    return steady or fresh


def _level(k: Key, alg: str, near: list[int] | None = None) -> float | None:
    """The typical cost of ``alg``'s fresh samples: all of them (the period's level), or
    those within WINDOW records of the record numbers ``near`` (a contender's: paired in
    time). None from fewer than 3."""
    fresh = _fresh(k, alg)
    if near:
        lo, hi = min(near) - WINDOW, max(near) + WINDOW
        fresh = [x for x in fresh if lo <= x[0] <= hi]
    return typical(x[1] for x in fresh) if len(fresh) >= 3 else None


def judge(k: Key) -> tuple[str, bool, str]:
    """(current algorithm, burst next period, why) from the samples (rank 0). A
    contender is compared with the current algorithm's calls next to its own (a load
    that comes and goes on a shared machine moves both alike)."""
    cur = _level(k, k.current)
    if cur is None:
        return k.current, False, ""
    best, best_r, seen = k.current, 1.0, ""
    hint, promising = k.hint, []
    if hint:  # judged now if its run's records came, else it waits a decision more
        k.hint_left -= 1
        if k.hint_left <= 0 or _fresh(k, hint):
            k.hint = ""
    for a in k.algorithms:
        s = _fresh(k, a)
        if a == k.current or not s:
            continue
        t = typical(w for _, w, _ in s)
        base = _level(k, k.current, near=[r for r, _, _ in s]) or cur
        paired = k.ratio[a] = t / base
        evidence = (f"{len(s)} calls: {t / 1e3:.0f} us against {base / 1e3:.0f} beside them, "
                    f"{cur / 1e3:.0f} over the period")
        # a switch needs 3 calls or more, faster than both the calls next to them and
        # the period's (a few calls beside them are easily off on a busy machine), or
        # than the calls beside them twice in a row (the period's level is unpaired: a
        # machine that speeds up over the period hides a 1.2x faster contender measured
        # early in it), or one call HOPELESS**2 times faster
        r = paired if a == hint else max(paired, t / cur)
        if len(s) >= 3:
            k.reads[a] = k.reads.get(a, 0) + 1
            if paired <= 1 - SWITCH:
                promising.append((paired, a))
        if (len(s) >= 3 or r < HOPELESS ** -2) and r < best_r:
            best, best_r, seen = a, r, evidence + ", a second paired reading" * (a == hint)
    k.ratio[k.current] = 1.0
    probe = k.calls <= PERIOD  # then a burst of the contenders worth measuring
    if best != k.current and best_r <= 1 - SWITCH:
        k.chosen_level, k.hint = cur * best_r, ""
        k.ratio = {a: r / best_r for a, r in k.ratio.items()}
        return best, probe, f"{best} {1 / best_r:.2f}x faster than {k.current} ({seen})"
    if promising and not probe and not k.hint:
        k.hint, k.hint_left = min(promising)[1], HINT_WAIT
    if probe:
        near = [a for a in k.algorithms if a != k.current and k.ratio.get(a, 1.0) <= HOPELESS ** 2]
        return k.current, bool(near), f"probe: {', '.join(near)} within {HOPELESS ** 2:g}x" * bool(near)
    # the drift reads all the current algorithm's calls since the previous decision, as
    # `cur` is (the last WINDOW alone moves past DRIFT on a busy host's noise, each time
    # a burst)
    if not k.chosen_level:
        k.chosen_level = cur
    drift = abs(cur - k.chosen_level) / k.chosen_level
    if drift > DRIFT or k.deferred:  # the machine changed: measure the contenders afresh
        # a burst may overdraw the exploration budget once; later runs wait to repay it
        k.deferred = k.explored > EXPLORE * k.calls
        if not k.deferred:
            k.chosen_level = 0.0
            return k.current, True, f"drift {drift:.0%}"
    return k.current, False, ""


def after_probe(k: Key) -> tuple[str, bool, str]:
    """(current, burst, why) right after a new key's probe (rank 0): the fastest probed
    algorithm when `current`'s one call took HOPELESS**2 times as long (no burst: the
    period's end brings it)."""
    one = {a: typical(w for _, w, _ in s) for a in k.algorithms if (s := _fresh(k, a))}
    best = min(one, key=one.__getitem__, default=k.current)
    if k.current not in one or one[best] * HOPELESS ** 2 > one[k.current]:
        return k.current, False, ""
    k.ratio = {a: t / one[best] for a, t in one.items()}
    return best, False, f"{best} {one[k.current] / one[best]:.2f}x faster than {k.current} (probe)"


def burst_for(k: Key, cur: str) -> tuple[str, ...]:
    """A burst (after the probe or a drift): the current algorithm and its contenders
    (not the HOPELESS; after the probe, whose one call each is a rough guide, not those
    HOPELESS**2 slower)."""
    limit = HOPELESS ** 2 if k.calls <= PERIOD else HOPELESS
    return tuple(a for a in k.algorithms if a == cur or k.ratio.get(a, 1.0) <= limit)


def quiet_after(k: Key, explore: str, burst: tuple) -> bool:
    """Whether the decision point after this decision (rank 0) is left out, on every rank
    (no records read, nothing judged, no Python pick: the C dispatch serves it; the plan
    goes on): a settled key (past its first two periods) whose next period runs no burst
    or exploration, no drift's burst or hint waiting. A key that holds its algorithm is
    then judged every other period (on CPU a decision is rank 0's Python on every rank's
    critical path), and a change of the machine still shows as a drift within 2
    periods."""
    return (k.calls >= 2 * PERIOD and k.calls % PERIOD == 0 and not burst and not explore
            and not k.deferred and not k.hint)


def contender(k: Key, cur: str) -> str:
    """The contender the next period's run measures, "" for none: the ``hint`` (a
    paired reading to repeat; charged to the budget, never refused), a contender read
    only once (its second reading: the same), else one within the budget of
    calls (EXPLORE), and of time: a HOPELESS one within HOPELESS_TIME of the key's time,
    the others within EXPLORE_TIME (the run's calls over `current`'s as last measured,
    and the two changes of algorithm), so that a key holding the best algorithm pays
    about 1% for watching the others."""
    if k.hint and k.hint_left == HINT_WAIT and k.hint != cur:  # just hinted: a paired
        # reading to repeat once, charged to the budget, not refused
        k.near += _near_cost(k, k.hint)
        return k.hint
    others = [a for a in k.algorithms if a != cur]
    for a in others:  # read once (a burst's few calls), not HOPELESS: once more, early,
        # charged to the budget, not refused (a busy host easily reads 4 calls 25% off,
        # and the budget would next run it hundreds of calls later)
        if k.reads.get(a) == 1 and a not in k.confirming and k.ratio.get(a, 1.0) <= HOPELESS:
            k.confirming.add(a)
            k.near += _near_cost(k, a)
            return a
    if k.explored + RUN > EXPLORE * (k.calls + PERIOD // 2):
        return ""
    for i in range(len(others)):
        a = others[(k.rounds + i) % len(others)]
        r = k.ratio.get(a, 1.0)
        if r > HOPELESS:  # on its own budget
            over = RUN * (r - 1)
            if k.excess + over > HOPELESS_TIME * k.calls:
                continue
            k.excess += over
        else:
            over = _near_cost(k, a)
            if k.near + over > EXPLORE_TIME * k.calls:
                continue
            k.near += over
        k.rounds += i + 1
        return a
    return ""


def _near_cost(k: Key, a: str) -> float:
    """A run of ``a`` (not HOPELESS) over `current`'s time, in its calls: its RUN calls
    as last measured and the two changes of algorithm."""
    return RUN * max(k.ratio.get(a, 1.0) - 1, 0.0) + 2 * SWITCH_COST
