"""Online selection for ``algorithm="auto"``: start from the table, measure, follow.

Per key (op, size bucket = a power of two, dtype, world size, world generation):

    current = the tuning table's choice (or the defaults)        # _select.choose
    first PERIOD calls: one call of every algorithm, `current` first (a probe); right after it (at
      PROBE_DECISIONS, once the probe's records are complete) rank 0 switches to the
      fastest probed one if `current` was HOPELESS**2 slower than it (a wrong table
      must not run for the rest of the period); then `current`; the
      next period measures `current` and the contenders the probe found within
      HOPELESS**2 of it (one call each is a rough guide), BURST calls each (a burst)
    every PERIOD-th call: rank 0 decides from the call records (``feed``: cycle or wire
      time; ``typical`` cost of each algorithm's samples since the previous decision):
        another algorithm >= SWITCH faster than     -> it becomes `current`
          `current`'s calls next to its own and
          `current`'s calls in the period (or than
          the calls next to its own twice running)
        faster only than the calls next to its own  -> a run of it next period (a hint)
        a contender read once only (a burst's few   -> a run of it next period (its second
          calls), within HOPELESS                      reading)
        `current`'s cost moved > DRIFT              -> a burst period (BURST calls of
                                                       `current` and its contenders)
        else, within the budgets below              -> RUN calls of one contender in
                                                       the middle of the next period
    all other calls: `current`

Budget: beyond a key's first period at most EXPLORE (2%) of its calls explore; an
algorithm measured HOPELESS times slower than `current` only while the time its calls
cost over `current`'s stays within HOPELESS_TIME (0.5%) of the key's calls (a ring call
can cost 100 others), any other only while its runs' time over `current`'s, the two
algorithm changes of each run included (SWITCH_COST), stays within EXPLORE_TIME (0.5%).
A settled key's decision points alternate: a decision that plans no burst or
exploration says, in its word, that the next decision point is left out on every rank
(``quiet_after``: a decision costs rank 0's Python, on CPU on every rank's critical
path; the C dispatch serves the point left out).

No agreement of its own: rank 0 writes its decision at call c (note word d % NOTES of
its control block for the d-th decision point, tagged with the key and c, before it
publishes call c) and every rank takes it at its next ``auto`` pick: a peer first makes
sure rank 0 published call c (on CPU it has: call c's kernel needed it), then reads the
word; a tag that is not (key, c) means rank 0 made no decision there. Rank 0 writes a
word again only once every peer published the call at which it read what it held (else
that key decides a period later; NOTES words let keys called in turn decide on
neighbouring calls). So every rank runs the same algorithm on every call, and a key
that holds its algorithm makes no waiting call beyond what the same fixed one makes.

Between picks the C dispatch serves the calls (``runtime/_fastcall.c``): a pick that
runs `current` again, with no decision pending, grants the key's ``Budget`` the calls up
to the next decision, burst or exploration (``_quiet``; the schedule is the same on every
rank), and the next pick counts what it served. So a key that holds its algorithm costs
what the fixed algorithm costs, bar one Python pick per stretch. Constants, the key's
state and rank 0's judgement live in ``_adapt_rules``.

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
from typing import Any

import torch

from commlab import _config
from commlab.collectives import _adapt_rules as _rules
from commlab.collectives._select import choose
from commlab.runtime import _native
from commlab.runtime import records as _records
from commlab.runtime._control import NOTES, ControlBlock

_FROZEN: set = set()  # keys whose capture freeze was reported


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


def pick(comm, op: str, x, algorithms: tuple[str, ...]) -> tuple[str | None, bool, Any]:
    """The algorithm this ``auto`` call runs, or None (not adapted: the usual choice),
    whether it differs from the one the key's previous call ran (``fence``), and the
    key's budget (a ``_fastcall.Budget`` granting the C dispatch the calls after this
    one that run the same algorithm with nothing to decide; None: no C dispatch)."""
    if len(algorithms) < 2 or not isinstance(x, torch.Tensor) or x.numel() == 0 or not on(comm):
        return None, False, None
    capturing = comm.backend == "cuda" and torch.cuda.is_current_stream_capturing()
    key = key_for(comm, op, x)
    k = _state(comm).get(key)
    if k is not None and k.budget is not None:  # the calls the C dispatch served since
        k.calls += k.budget.take()
    if capturing:  # a capture replays later, between calls it cannot see
        return _frozen(key, k), False, None
    if k is None:
        k = _new_key(comm, key, op, x, algorithms)
        if k is None:
            return None, False, None
    note = _note(comm)
    if note.pending is not None:
        pending, note.pending = note.pending, None
        _take(comm, note, *pending)
    alg = _next(comm, note, key, k)
    changed, k.last = bool(k.last) and alg != k.last, alg
    if k.budget is not None and alg == k.current and not changed and note.pending is None:
        k.budget.left = _quiet(k)
    return alg, changed, k.budget


def reset(comm) -> None:
    """Forget every key (``tune()``: start again from the new table's choices); the C
    dispatch serves none of their calls any more."""
    for k in _state(comm).values():
        if k.budget is not None:
            k.budget.take()
    comm.adapt = {}


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


def _new_key(comm, key: tuple, op: str, x, algorithms: tuple[str, ...]) -> _rules.Key | None:
    algs = tuple(a for a in algorithms if a != "copy_engine")  # chosen only in captures
    table = choose(comm, op, x.dtype, x.numel() * x.element_size(), algorithms)
    if not 2 <= len(algs) <= 7 or table not in algs:  # the note holds 7 algorithms
        return None
    note = _note(comm)
    note.tags += 1
    # the probe runs the table's choice first: a key's first call pays for whatever ran
    # before it (another size, a barrier), which the period's calls of `current`
    # outweigh, where a contender's one probe call read so could exile it
    probe = (table,) + tuple(a for a in algs if a != table)
    k = _state(comm)[key] = _rules.Key(algs, table, table, note.tags, burst=probe, per=1,
                                       budget=_native.budget())
    return k


def _next(comm, note: _Note, key: tuple, k: _rules.Key) -> str:
    """Count the call, pick its algorithm from the period's plan; rank 0 decides at the
    period's end (taken by every rank at its next pick)."""
    k.calls += 1
    slot = k.calls % _rules.PERIOD
    alg = k.current
    if k.calls == k.quiet:  # left out, as rank 0's last decision said: the plan goes on
        pass
    elif slot == 0 or k.calls - len(k.algorithms) in _rules.PROBE_DECISIONS:  # a period's end, the probe's
        word = note.decisions % NOTES
        note.decisions += 1
        note.pending = (comm.control.seq + 1, key, k.calls, word,
                        _decide(comm, note, k, word) if comm.rank == 0 else None)
    elif k.burst and slot <= k.per * len(k.burst):
        alg = k.burst[(slot - 1) // k.per]
    elif k.explore and _in(slot, _rules.explore_slots()):
        alg = k.explore
    if alg != k.current:
        comm.adapt_mixed = comm.adapt_stretch = True  # rank 0 reads every record next
        if k.calls > 2 * _rules.PERIOD:  # the first two periods learn
            k.explored += 1
    elif comm.rank == 0 and getattr(comm, "adapt_stretch", False):  # a burst or run ended:
        comm.adapt_stretch = False  # its records, before other calls fill the ring
        feed(comm, ended=True)
    return alg


def _in(slot: int, span: tuple[int, int]) -> bool:
    return span[0] <= slot <= span[1]


def _quiet(k: _rules.Key) -> int:
    """How many calls after the key's last one ``_next`` would give `current` without a
    decision, a burst or an exploration (the same on every rank): the C dispatch may
    serve them without asking Python."""
    c = k.calls
    base = c - c % _rules.PERIOD
    end = base + _rules.PERIOD  # the period's decision (the next one's where it is left out)
    if end == k.quiet:
        end += _rules.PERIOD
    for p in _rules.PROBE_DECISIONS:
        if c < len(k.algorithms) + p < end:
            end = len(k.algorithms) + p
            break
    spans = [(1, k.per * len(k.burst))] if k.burst else []
    if k.explore:
        spans.append(_rules.explore_slots())
    for lo, hi in spans:  # the first call of a span still ahead
        if base + hi > c:
            end = min(end, max(base + lo, c + 1))
    return end - c - 1


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
                        tuple(a for i, a in enumerate(k.algorithms) if burst >> i & 1),
                        bool(burst & _QUIET))
    if k is not None:
        k.current, k.explore, k.burst, quiet = decision or (k.current, "", (), False)
        k.quiet = call + _rules.PERIOD if quiet else 0
        k.per = _rules.BURST
        k.decided += decision is not None


def _decide(comm, note: _Note, k: _rules.Key, word: int) -> tuple | None:
    """Rank 0: the next period's plan (current, explore, burst), written in note word
    ``word`` (None: a peer has not read what it holds yet; decide at the next period)."""
    ctl = comm.control
    seen = note.read_at[word]
    if seen and not all(ctl.published(r, seen) for r in ctl.peers):
        return None
    feed(comm)
    cur, burst, why = _rules.judge(k) if k.calls % _rules.PERIOD == 0 else _rules.after_probe(k)
    if why:
        k.history.append((k.calls, cur, why))
    explore = "" if burst else _rules.contender(k, cur)
    algs = _rules.burst_for(k, cur) if burst else ()
    quiet = _rules.quiet_after(k, explore, algs)
    ctl.set_note(_encode(k.tag, k.calls, k.algorithms.index(cur),
                         k.algorithms.index(explore) if explore else -1,
                         sum(1 << k.algorithms.index(a) for a in algs) | _QUIET * quiet), word)
    return cur, explore, algs, quiet


_QUIET = 1 << 7  # in the burst mask (7 algorithms at most): the next decision point is left out


def _encode(tag: int, call: int, cur: int, explore: int, burst: int) -> int:
    """One word below 2**63: call (32 bits) | tag (16) | burst mask (8; its top bit
    ``_QUIET``) | explore + 1 (4) | current (3); algorithms as indices into the key's
    ``algorithms``."""
    return ((call % (1 << 32)) << 31 | (tag % (1 << 16)) << 15 | (burst & 0xFF) << 7
            | (explore + 1) << 3 | cur)


def _decode(v: int) -> tuple[int, int, int, int, int]:
    """(tag, call, current, explore or -1, burst mask) of a word ``_encode`` wrote."""
    return (v >> 15) & 0xFFFF, v >> 31, v & 7, ((v >> 3) & 0xF) - 1, (v >> 7) & 0xFF


# --- rank 0's judgement ---------------------------------------------------------------


_SINCE_MAX = 255  # a sample's calls since its key's change, counted up to this


def feed(comm, ended: bool = False) -> None:
    """Give every key the cost of its calls recorded since the last feed: the cycle (the
    last rank's end of the previous call to its end of this one: what a loop of calls
    waits for) where the previous call's record came just before, else the wire time; a
    call that ran another algorithm than its key's previous call (a change, whatever
    calls came between) costs its wire time; each sample keeps its calls since its
    key's last change (the change and the call after it, SETTLE, are unsettled: used
    only where nothing else is).
    The cycle sees what the wire leaves out: on a rank that shares its core, the
    scheduler's pauses land outside some algorithms' windows and inside others'.
    Reads the book's records past its own cursor, so a reader that collects them too
    (``%dist_watch``, ``records.recent``) takes none away. ``ended``: a burst or run ended
    (the next decision still reads every record since)."""
    keys = _state(comm)
    world, generation = comm.world_size, comm.generation
    maxlen = _rules.PERIOD
    stamps: dict = {}  # key -> (its Key or None, the calls stamped on its samples)
    # the last record fed: (its book, the next record's number, its end); a new book (a
    # recover zeroed the records, a new world) numbers its records from 1 again
    book = _records.book(comm)
    prev = getattr(comm, "adapt_prev", None)
    prev = prev[1:] if prev is not None and prev[0] is book else None
    for rec in _to_feed(comm, ended):  # kept lean: rank 0's critical path
        end = rec.last_end
        key = (rec.op, max(rec.nbytes, 1).bit_length(), rec.dtype, world, generation)
        alg = rec.algorithm
        before, prev = prev, (rec.call + rec.span, end)
        got = stamps.get(key)
        if got is None:
            k = keys.get(key)
            got = stamps[key] = (k, _rules.calls_of(k) if k is not None else 0)
        k, stamp = got
        if k is None:
            continue
        if k.fed[0] != alg:
            # it changed its key's algorithm and paid for the change (a waiting
            # agreement, the devices' fence): its wire time, which leaves the agreement
            # out (a new key's probe compares one such call of each)
            cost, since = end - rec.last_entry, 0
        else:
            cost = end - (before[1] if before is not None and before[0] == rec.call
                          else rec.last_entry)
            since = min(k.fed[1] + 1, _SINCE_MAX)
        k.fed = (alg, since)
        s = k.samples.get(alg)
        if s is None:
            s = k.samples[alg] = deque(maxlen=maxlen)
        s.append((stamp, rec.call, max(cost, 1), since))
    comm.adapt_prev = None if prev is None else (book, *prev)


def _to_feed(comm, ended: bool = False) -> list:
    """The records to learn from, past the last one fed. CPU: in brief, read where they
    lie (``Book.peek``): every one the ring holds where a call since the previous feed
    ran another algorithm than its key's current (a probe, a burst, a contender's run:
    each is compared with the calls beside it), else the newest TAIL (the current
    algorithms' level: each record read is rank 0's Python on every CPU rank's critical
    path). GPUs: every record, collected (a collect hands out the copy the previous one
    started, so a burst's records may come a decision late; the decision's Python
    overlaps the device's work there). Rank 0 also feeds at the first call of `current`
    after a burst or run (``ended``, from ``_next``): a ring shared by every key's calls
    could go round before the key's decision."""
    book = _records.book(comm)
    mixed = getattr(comm, "adapt_mixed", True)
    comm.adapt_mixed = mixed and ended  # a decision's feed resets it
    if book is None:
        return []
    if not book.cpu:
        return _unread(comm)
    after = getattr(comm, "adapt_fed", (None, 0))  # (book, the next record to feed)
    recs = book.peek(_records.RECORD_RING if mixed else _rules.TAIL,
                     after[1] if after[0] is book else 0)
    if recs:
        comm.adapt_fed = (book, recs[-1].call + recs[-1].span)
    return recs


def _unread(comm) -> list:
    """The call records collected since ``feed`` last read them (GPUs)."""
    book = _records.book(comm)
    if book is None:
        return []
    book.collect()
    mark = getattr(comm, "adapt_read", None)  # (book, records read): a new book starts over
    new = book.since(mark[1] if mark is not None and mark[0] is book else 0, book.KEEP)
    comm.adapt_read = (book, book.seen)
    return new


def mark(comm) -> int | None:
    """Where the call records stand now, for ``forget`` (None: records are off)."""
    book = _records.book(comm)
    return None if book is None else book.mark()


def forget(comm, since: int | None) -> None:
    """Leave the records of the calls made since ``mark`` returned ``since`` unread by
    online selection (a benchmark's fixed-algorithm calls between adaptive ones, which
    are not the adaptive key's to learn from)."""
    book = _records.book(comm)
    if book is not None and since is not None:
        book.forget(since)


def _frozen(key: tuple, k: _rules.Key | None) -> str | None:
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
        med = {a: (statistics.median(w for _, _, w, _ in s) / 1e3 if s else None)
               for a, s in k.samples.items()}
        out[key] = {"current": k.current, "table": k.table, "calls": _rules.calls_of(k),
                    "decided": k.decided, "median_us": med, "history": list(k.history)}
    return out
