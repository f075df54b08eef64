"""Online selection for ``algorithm="auto"``: start from the table, measure, follow.

Per key (op, size bucket = a power of two, dtype, world size, world generation):

    current = the tuning table's choice (or the defaults)        # _select.choose
    first PERIOD calls: one call of every algorithm (a probe); right after it (at
      PROBE_DECISIONS, once the probe's records are complete) rank 0 switches to the
      fastest probed one if `current` was HOPELESS**2 slower than it (a wrong table
      must not run for the rest of the period); then `current`; the
      next period measures `current` and the contenders the probe found within
      HOPELESS**2 of it (one call each is a rough guide), BURST calls each (a burst)
    every PERIOD-th call: rank 0 decides from the call records (wire time, median of
      each algorithm's samples since the previous decision):
        another algorithm >= SWITCH faster than     -> it becomes `current`
          `current`'s calls next to its own and
          `current`'s last WINDOW calls
        `current`'s median moved > DRIFT            -> a burst period (BURST calls of
                                                       `current` and its contenders)
        else, within the EXPLORE budget             -> RUN calls of one contender in
                                                       the middle of the next period
    all other calls: `current`

Budget: beyond a key's first period at most EXPLORE (2%) of its calls explore, and an
algorithm measured HOPELESS times slower than `current` only while the time its calls
cost over `current`'s stays within EXPLORE of the key's calls (a ring call can cost 100
others). A run of RUN calls pays two algorithm changes (each a waiting agreement) for
RUN samples.

No agreement of its own: rank 0 writes its decision at call c (note word d % NOTES of
its control block for the d-th decision point, tagged with the key and c, before it
publishes call c) and every rank takes it at its next ``auto`` pick: a peer first makes
sure rank 0 published call c (on CPU it has: call c's kernel needed it), then reads the
word; a tag that is not (key, c) means rank 0 made no decision there. Rank 0 writes a
word again only once every peer published the call at which it read what it held (else
that key decides a period later; NOTES words let keys called in turn decide on
neighbouring calls). So every rank runs the same algorithm on every call, and a key
that holds its algorithm makes no waiting call beyond what the same fixed one makes.

The picked algorithm is agreed as its own signature field ("online"): the kernels' "no
trailing barrier" arguments hold between calls of one algorithm only, so a call that
runs another algorithm than the previous one must not run ahead as its repeat (it waits;
on CUDA the devices also meet first: ``fence``). A CUDA-graph capture freezes the key's
current choice (a replay cannot re-choose) and says so once. Default ``COMMLAB_ADAPT=cpu``
(the CPU backend; GPUs with ``COMMLAB_RECORDS=1 COMMLAB_ADAPT=1``); ``COMMLAB_ADAPT=0``: ``auto`` is
the table's choice, deterministically.
"""

from __future__ import annotations

import statistics
import sys
from collections import deque
from dataclasses import dataclass, field

import torch

from commlab import _config
from commlab.collectives._select import choose
from commlab.runtime import records as _records
from commlab.runtime._control import NOTES, ControlBlock

PERIOD = 50  # calls between decisions
# calls after a new key's probe at which rank 0 may leave `current`: a peer may still be
# finishing the probe's last call (its record incomplete) at the first
PROBE_DECISIONS = (1, 3, 6)
BURST = 4  # calls per algorithm in a burst period
RUN = 3  # calls of one contender per steady exploration (enough for a median)
WINDOW = 9  # samples per algorithm in a median
SWITCH = 0.05  # another algorithm this much faster (median) takes over
DRIFT = 0.20  # the current algorithm's median moving this much starts a burst
HOPELESS = 2.0  # slower than the current by this factor: explored on the time budget
EXPLORE = 0.02  # exploring calls per call (a key's first period aside); also the
#                 time budget of HOPELESS algorithms, in calls of the current one
_FROZEN: set = set()  # keys whose capture freeze was reported


@dataclass
class _Key:
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
    samples: dict = field(default_factory=dict)  # algorithm -> deque of (call, record, wire ns)
    ratio: dict = field(default_factory=dict)  # algorithm -> last median / current's
    chosen_median: float = 0.0  # the current algorithm's median when it was chosen
    excess: float = 0.0  # HOPELESS explorations' time over `current`, in its calls
    rounds: int = 0  # steady explorations scheduled (which contender is next)
    deferred: bool = False  # a drift's burst waits until the budget allows it
    history: list = field(default_factory=list)  # (call, algorithm, why) decisions


@dataclass
class _Note:
    """The decision channel of one communicator and world generation (kept across
    ``tune()``, which drops the keys: a peer may still have to read the last word)."""

    generation: int
    tags: int = 0  # keys made so far (a key's tag)
    decisions: int = 0  # decision points so far: decision d goes in word d % NOTES
    # (seq, key, call, word, rank 0's decision or None) to take at the next pick
    pending: tuple | None = None
    # rank 0: per word, the call at which the peers take what it holds
    read_at: list = field(default_factory=lambda: [0] * NOTES)


def on(comm) -> bool:
    """Whether ``auto`` adapts on ``comm``: read once per communicator and world
    generation (COMMLAB_ADAPT: on, or "cpu" on the CPU backend; records on, one host,
    more than one rank)."""
    cached = getattr(comm, "adapt_on", None)
    if cached is None or cached[0] != comm.generation:
        mode = _config.get("COMMLAB_ADAPT")  # True, False or "cpu" (that backend only)
        cached = (comm.generation, (mode is True or mode == "cpu" and comm.backend == "cpu")
                  and _records.enabled()
                  and comm.world_size > 1 and comm.local is comm
                  and isinstance(comm.control, ControlBlock))
        comm.adapt_on = cached
    return cached[1]


def _state(comm) -> dict:
    st = getattr(comm, "adapt", None)
    if st is None:
        st = {}
        comm.adapt = st
    return st


def _note(comm) -> _Note:
    n = getattr(comm, "adapt_note", None)
    if n is None or n.generation != comm.generation:  # a new world: a new sequence
        n = comm.adapt_note = _Note(comm.generation)
    return n


_DTYPE_NAMES: dict = {}  # torch.float32 -> "float32" (str() of a dtype: ~0.3 µs a call)


def key_for(comm, op: str, x: torch.Tensor) -> tuple:
    """The key of a call; the same as its records give (their bytes: output or input,
    the larger)."""
    nbytes = x.numel() * x.element_size() * (comm.world_size if op == "all_gather" else 1)
    name = _DTYPE_NAMES.get(x.dtype)
    if name is None:
        name = _DTYPE_NAMES[x.dtype] = str(x.dtype).replace("torch.", "")
    return (op, max(nbytes, 1).bit_length(), name, comm.world_size, comm.generation)


def pick(comm, op: str, x, algorithms: tuple[str, ...]) -> tuple[str | None, bool]:
    """The algorithm this ``auto`` call runs, or None (not adapted: the usual choice),
    and whether it differs from the one the key's previous call ran (``fence``)."""
    if len(algorithms) < 2 or not isinstance(x, torch.Tensor) or x.numel() == 0 or not on(comm):
        return None, False
    capturing = comm.backend == "cuda" and torch.cuda.is_current_stream_capturing()
    key = key_for(comm, op, x)
    k = _state(comm).get(key)
    if capturing:  # a capture replays later, between calls it cannot see
        return _frozen(key, k), False
    if k is None:
        k = _new_key(comm, key, op, x, algorithms)
        if k is None:
            return None, False
    note = _note(comm)
    if note.pending is not None:
        pending, note.pending = note.pending, None
        _take(comm, note, *pending)
    alg = _next(comm, note, key, k)
    changed, k.last = bool(k.last) and alg != k.last, alg
    return alg, changed


def fence(comm) -> None:
    """Before a call whose algorithm differs from its key's previous one, after the
    agreement: on CUDA every rank's device meets (a one-program barrier kernel), so the
    previous kernel has finished reading its inboxes on every rank before this one
    pushes into the peers' (the kernels' "no trailing barrier" arguments hold only
    between calls of one algorithm). On CPU the waiting agreement already is that
    point: a kernel there returns when it is done."""
    if comm.backend == "cuda":
        from commlab.collectives.barrier import barrier_kernel  # noqa: PLC0415

        barrier_kernel[(1,)](comm.context)


def _new_key(comm, key: tuple, op: str, x, algorithms: tuple[str, ...]) -> _Key | None:
    algs = tuple(a for a in algorithms if a != "copy_engine")  # chosen only in captures
    table = choose(comm, op, x.dtype, x.numel() * x.element_size(), algorithms)
    if not 2 <= len(algs) <= 7 or table not in algs:  # the note holds 7 algorithms
        return None
    note = _note(comm)
    note.tags += 1
    k = _state(comm)[key] = _Key(algs, table, table, note.tags, burst=algs, per=1)
    return k


def _next(comm, note: _Note, key: tuple, k: _Key) -> str:
    """Count the call, pick its algorithm from the period's plan; rank 0 decides at the
    period's end (taken by every rank at its next pick)."""
    k.calls += 1
    slot = k.calls % PERIOD
    alg = k.current
    if slot == 0 or k.calls - len(k.algorithms) in PROBE_DECISIONS:  # a period's end, the probe's
        word = note.decisions % NOTES
        note.decisions += 1
        note.pending = (comm.control.seq + 1, key, k.calls, word,
                        _decide(comm, note, k, word) if comm.rank == 0 else None)
    elif k.burst and slot <= k.per * len(k.burst):
        alg = k.burst[(slot - 1) // k.per]
    elif k.explore and PERIOD // 2 <= slot < PERIOD // 2 + RUN:
        alg = k.explore
    if alg != k.current and k.calls > 2 * PERIOD:  # the first two periods learn
        k.explored += 1
    return alg


# --- the note: rank 0's decision, taken one pick later --------------------------------


def _take(comm, note: _Note, seq: int, key: tuple, call: int, word: int,
          decision: tuple | None) -> None:
    """Every rank: apply the decision made at the previous pick, call ``seq`` (rank 0's
    own, or what rank 0 wrote in ``word`` then; a word tagged otherwise: no decision)."""
    ctl = comm.control
    k = _state(comm).get(key)  # None: tune() dropped the keys since
    if comm.rank == 0:
        if decision is not None:
            note.read_at[word] = ctl.seq + 1  # the peers read the word before publishing this
    else:
        ctl.wait_published(0, seq, key[0])
        tag, c, cur, explore, burst = _decode(ctl.note(0, word))
        if k is not None and (tag, c) == (k.tag % (1 << 16), call % (1 << 32)):
            decision = (k.algorithms[cur], k.algorithms[explore] if explore >= 0 else "",
                        tuple(a for i, a in enumerate(k.algorithms) if burst >> i & 1))
    if k is not None:
        k.current, k.explore, k.burst = decision or (k.current, "", ())
        k.per = BURST
        k.decided += decision is not None


def _decide(comm, note: _Note, k: _Key, word: int) -> tuple | None:
    """Rank 0: the next period's plan (current, explore, burst), written in note word
    ``word`` (None: a peer has not read what it holds yet; decide at the next period)."""
    ctl = comm.control
    seen = note.read_at[word]
    if seen and not all(ctl.published(r, seen) for r in ctl.peers):
        return None
    feed(comm)
    cur, burst, why = _judge(k) if k.calls % PERIOD == 0 else _after_probe(k)
    if why:
        k.history.append((k.calls, cur, why))
    explore = "" if burst else _explore(k, cur)
    algs = _burst(k, cur) if burst else ()
    ctl.set_note(_encode(k.tag, k.calls, k.algorithms.index(cur),
                         k.algorithms.index(explore) if explore else -1,
                         sum(1 << k.algorithms.index(a) for a in algs)), word)
    return cur, explore, algs


def _encode(tag: int, call: int, cur: int, explore: int, burst: int) -> int:
    """One word below 2**63: call (32 bits) | tag (16) | burst mask (8) | explore + 1 (4)
    | current (3); algorithms as indices into the key's ``algorithms``."""
    return ((call % (1 << 32)) << 31 | (tag % (1 << 16)) << 15 | (burst & 0xFF) << 7
            | (explore + 1) << 3 | cur)


def _decode(v: int) -> tuple[int, int, int, int, int]:
    """(tag, call, current, explore or -1, burst mask) of a word ``_encode`` wrote."""
    return (v >> 15) & 0xFFFF, v >> 31, v & 7, ((v >> 3) & 0xF) - 1, (v >> 7) & 0xFF


# --- rank 0's judgement ---------------------------------------------------------------


def feed(comm) -> None:
    """Give every key the wire times of its calls recorded since the last feed."""
    keys = _state(comm)
    for rec in _records.collect(comm):
        key = (rec.op, max(rec.nbytes, 1).bit_length(), rec.dtype, comm.world_size,
               comm.generation)
        k = keys.get(key)
        if k is not None:
            s = k.samples.setdefault(rec.algorithm, deque(maxlen=PERIOD))
            s.append((k.calls, rec.call, rec.wire_ns))


def _fresh(k: _Key, alg: str) -> list[tuple[int, int]]:
    """(record number, wire ns) of ``alg``'s samples fed since the previous decision."""
    return [(r, w) for c, r, w in k.samples.get(alg, ()) if c > k.calls - PERIOD]


def _median(k: _Key, alg: str, near: list[int] | None = None) -> float | None:
    """The median wire time of ``alg``'s fresh samples: the last WINDOW, or those within
    WINDOW records of the record numbers ``near`` (a contender's: paired in time)."""
    fresh = _fresh(k, alg)
    if near:
        lo, hi = min(near) - WINDOW, max(near) + WINDOW
        fresh = [(r, w) for r, w in fresh if lo <= r <= hi]
    else:
        fresh = fresh[-WINDOW:]
    return statistics.median(w for _, w in fresh) if len(fresh) >= 3 else None


def _judge(k: _Key) -> tuple[str, bool, str]:
    """(current algorithm, burst next period, why) from the samples (rank 0). A
    contender is compared with the current algorithm's calls next to its own (a load
    that comes and goes on a shared machine moves both alike)."""
    cur = _median(k, k.current)
    if cur is None:
        return k.current, False, ""
    best, best_r = k.current, 1.0
    for a in k.algorithms:
        s = _fresh(k, a)
        if a == k.current or not s:
            continue
        t = statistics.median(w for _, w in s)
        base = _median(k, k.current, near=[r for r, _ in s]) or cur
        k.ratio[a] = t / base
        # a switch needs a median of 3 or more (faster than both the calls next to it
        # and the last WINDOW: one window of a few calls is easily off on a busy
        # machine), or one call HOPELESS**2 times faster
        r = max(k.ratio[a], t / cur)
        if (len(s) >= 3 or r < HOPELESS ** -2) and r < best_r:
            best, best_r = a, r
    k.ratio[k.current] = 1.0
    probe = k.calls <= PERIOD  # then a burst of the contenders worth measuring
    if best != k.current and best_r <= 1 - SWITCH:
        k.chosen_median = cur * best_r
        k.ratio = {a: r / best_r for a, r in k.ratio.items()}
        return best, probe, f"{best} {1 / best_r:.2f}x faster than {k.current}"
    if probe:
        near = [a for a in k.algorithms if a != k.current and k.ratio.get(a, 1.0) <= HOPELESS ** 2]
        return k.current, bool(near), f"probe: {', '.join(near)} within {HOPELESS ** 2:g}x" * bool(near)
    if not k.chosen_median:
        k.chosen_median = cur
    drift = abs(cur - k.chosen_median) / k.chosen_median
    if drift > DRIFT or k.deferred:  # the machine changed: measure the contenders afresh
        # a burst may overdraw the exploration budget once; later runs wait to repay it
        k.deferred = k.explored > EXPLORE * k.calls
        if not k.deferred:
            k.chosen_median = 0.0
            return k.current, True, f"drift {drift:.0%}"
    return k.current, False, ""


def _after_probe(k: _Key) -> tuple[str, bool, str]:
    """(current, burst, why) right after a new key's probe (rank 0): the fastest probed
    algorithm when `current`'s one call took HOPELESS**2 times as long (no burst: the
    period's end brings it)."""
    one = {a: statistics.median(w for _, w in s) for a in k.algorithms if (s := _fresh(k, a))}
    best = min(one, key=one.__getitem__, default=k.current)
    if k.current not in one or one[best] * HOPELESS ** 2 > one[k.current]:
        return k.current, False, ""
    k.ratio = {a: t / one[best] for a, t in one.items()}
    return best, False, f"{best} {one[k.current] / one[best]:.2f}x faster than {k.current} (probe)"


def _burst(k: _Key, cur: str) -> tuple[str, ...]:
    """A burst (after the probe or a drift): the current algorithm and its contenders
    (not the HOPELESS; after the probe, whose one call each is a rough guide, not those
    HOPELESS**2 slower)."""
    limit = HOPELESS ** 2 if k.calls <= PERIOD else HOPELESS
    return tuple(a for a in k.algorithms if a == cur or k.ratio.get(a, 1.0) <= limit)


def _explore(k: _Key, cur: str) -> str:
    """The contender the next period's run measures, "" for none: within the budget of
    calls, and a HOPELESS one only within the budget of time."""
    if k.explored + RUN > EXPLORE * (k.calls + PERIOD // 2):
        return ""
    others = [a for a in k.algorithms if a != cur]
    for i in range(len(others)):
        a = others[(k.rounds + i) % len(others)]
        over = RUN * (k.ratio.get(a, 1.0) - 1)
        if k.ratio.get(a, 1.0) <= HOPELESS or k.excess + over <= EXPLORE * k.calls:
            k.rounds += i + 1
            if k.ratio.get(a, 1.0) > HOPELESS:
                k.excess += over
            return a
    return ""


def _frozen(key: tuple, k: _Key | None) -> str | None:
    if key not in _FROZEN:
        _FROZEN.add(key)
        now = k.current if k is not None else "the table's choice"
        print(f"commlab: CUDA-graph capture froze {key[0]}'s online choice for this size "
              f"({now}); a replay cannot re-choose", file=sys.stderr, flush=True)
    return None if k is None else k.current


def state(comm) -> dict:
    """Per key: the current algorithm, the table's, the calls, rank 0's decisions taken,
    the medians (µs; rank 0) and the changes decided (rank 0)."""
    out = {}
    for key, k in _state(comm).items():
        med = {a: (statistics.median(w for *_, w in s) / 1e3 if s else None)
               for a, s in k.samples.items()}
        out[key] = {"current": k.current, "table": k.table, "calls": k.calls,
                    "decided": k.decided, "median_us": med, "history": list(k.history)}
    return out
