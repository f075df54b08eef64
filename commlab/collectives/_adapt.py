"""Online selection for ``algorithm="auto"``: start from the table, measure, follow.

Per key (op, size bucket = a power of two, dtype, world size, world generation):

    current = the tuning table's choice (or the defaults)        # _select.choose
    every call: run `current`, except on a deterministic schedule
      - one call in PERIOD (2%) runs the next other algorithm    # steady exploration
      - in a burst period (a new key, a drift, a new world) BURST calls per algorithm
    every PERIOD-th call: rank 0 decides from the call records (wire time, median over
      the last WINDOW calls of each algorithm); another algorithm >= 5% faster becomes
      `current`; the current one's median moving > 20% from when it was chosen starts
      a burst. The decision travels in the agreement (rank 0's note in the control
      block), so every rank runs the same algorithm on every call.

The schedule depends only on how many calls of the key were made, which every rank
agrees on; only rank 0's decisions carry measurements. A CUDA-graph capture freezes the
key's current choice (a replay cannot re-choose) and says so once. ``COMMLAB_ADAPT=0``:
``auto`` is the table's choice, deterministically.
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
from commlab.runtime._control import ControlBlock, Signature

PERIOD = 50  # calls between decisions; one of them explores: 2%
BURST = 4  # calls per algorithm in a burst period
WINDOW = 9  # samples per algorithm in a median
SWITCH = 0.05  # another algorithm this much faster (median) takes over
DRIFT = 0.20  # the current algorithm's median moving this much starts a burst
_FROZEN: set = set()  # keys whose capture freeze was reported


@dataclass
class _Key:
    algorithms: tuple[str, ...]
    current: str
    table: str
    calls: int = 0
    burst: bool = True  # a new key explores its first period
    rounds: int = 0  # steady explorations made (which alternative is next)
    chosen_median: float = 0.0  # the current algorithm's median when it was chosen
    samples: dict = field(default_factory=dict)  # algorithm -> deque of wire ns
    history: list = field(default_factory=list)  # (call, algorithm, why) decisions


def on(comm) -> bool:
    # the cheap tests first: each setting read is an environment lookup, on every call
    return (comm.world_size > 1 and comm.local is comm
            and isinstance(comm.control, ControlBlock)
            and bool(_config.get("COMMLAB_ADAPT")) and _records.enabled())


def _state(comm) -> dict:
    st = getattr(comm, "adapt", None)
    if st is None:
        st = {}
        comm.adapt = st
    return st


def key_for(comm, op: str, x: torch.Tensor) -> tuple:
    """The key of a call; the same as its records give (their bytes: output or input,
    the larger)."""
    nbytes = x.numel() * x.element_size() * (comm.world_size if op == "all_gather" else 1)
    return (op, max(nbytes, 1).bit_length(), str(x.dtype).replace("torch.", ""),
            comm.world_size, comm.generation)


def pick(comm, op: str, x, algorithms: tuple[str, ...]) -> str | None:
    """The algorithm this ``auto`` call runs, or None (not adapted: the usual choice)."""
    if len(algorithms) < 2 or not isinstance(x, torch.Tensor) or x.numel() == 0 or not on(comm):
        return None
    algs = tuple(a for a in algorithms if a != "copy_engine")  # chosen only in captures
    if len(algs) < 2:
        return None
    keys = _state(comm)
    key = key_for(comm, op, x)
    k = keys.get(key)
    if comm.backend == "cuda" and torch.cuda.is_current_stream_capturing():
        return _frozen(key, k)
    if k is None:
        table = choose(comm, op, x.dtype, x.numel() * x.element_size(), algorithms)
        if table not in algs:
            return None
        k = keys[key] = _Key(algs, table, table)
    k.calls += 1
    slot = k.calls % PERIOD
    if slot == 0:
        _decide(comm, key, k)
        return k.current
    if k.burst and slot <= BURST * len(k.algorithms):
        return k.algorithms[(slot - 1) // BURST]
    if slot == PERIOD // 2:  # the steady exploration: the next other algorithm
        others = [a for a in k.algorithms if a != k.current]
        k.rounds += 1
        return others[k.rounds % len(others)]
    return k.current


def _frozen(key: tuple, k: _Key | None) -> str | None:
    if key not in _FROZEN:
        _FROZEN.add(key)
        now = k.current if k is not None else "the table's choice"
        print(f"commlab: CUDA-graph capture froze {key[0]}'s online choice for this size "
              f"({now}); a replay cannot re-choose", file=sys.stderr, flush=True)
    return None if k is None else k.current


def feed(comm) -> None:
    """Give every key the wire times of its calls recorded since the last feed."""
    keys = _state(comm)
    for rec in _records.collect(comm):
        key = (rec.op, max(rec.nbytes, 1).bit_length(), rec.dtype, comm.world_size,
               comm.generation)
        k = keys.get(key)
        if k is not None:
            k.samples.setdefault(rec.algorithm, deque(maxlen=WINDOW)).append(rec.wire_ns)


def _median(k: _Key, alg: str, least: int = 3) -> float | None:
    s = k.samples.get(alg)
    return statistics.median(s) if s is not None and len(s) >= least else None


def _decide(comm, key: tuple, k: _Key) -> None:
    """Rank 0 decides, every rank takes its decision (one agreement)."""
    ctl = comm.control
    if comm.rank == 0:
        feed(comm)
        cur, burst, why = _judge(k)
        ctl.set_note(_encode(k.calls, k.algorithms.index(cur), burst))
        if cur != k.current or why:
            k.history.append((k.calls, cur, why))
    ctl.agree(Signature("adapt", {"op": key[0], "call": k.calls}))
    calls, index, burst_bit = _decode(ctl.note(0))
    if calls != k.calls % (1 << 40):
        from commlab.errors import CommlabError  # noqa: PLC0415
        raise CommlabError(f"{key[0]}: rank 0's online choice is for call {calls}, this "
                           f"rank is at call {k.calls}; every rank must make the same calls")
    new = k.algorithms[index]
    if new != k.current:
        k.chosen_median = 0.0
    k.current, k.burst = new, bool(burst_bit)


def _judge(k: _Key) -> tuple[str, bool, str]:
    """(current algorithm, burst next period, why) from the samples (rank 0)."""
    cur = _median(k, k.current)
    if cur is None:
        return k.current, k.burst and not k.samples, ""
    best, best_t = k.current, cur
    for alg in k.algorithms:
        t = _median(k, alg)
        if t is not None and t < best_t:
            best, best_t = alg, t
    if best != k.current and best_t <= cur * (1 - SWITCH):
        k.chosen_median = best_t
        return best, False, f"{best} {cur / best_t:.2f}x faster than {k.current}"
    if not k.chosen_median:
        k.chosen_median = cur
    drift = abs(cur - k.chosen_median) / k.chosen_median
    if drift > DRIFT:  # the machine changed: measure every algorithm afresh
        k.chosen_median = 0.0
        for alg in k.algorithms:
            if alg != k.current:
                k.samples.pop(alg, None)
        return k.current, True, f"drift {drift:.0%}"
    return k.current, False, ""


def _encode(calls: int, index: int, burst: bool) -> int:
    return ((calls % (1 << 40)) << 16) | (int(burst) << 8) | index


def _decode(v: int) -> tuple[int, int, int]:
    return v >> 16, v & 0xFF, (v >> 8) & 1


def state(comm) -> dict:
    """Per key: the current algorithm, the table's, the medians (µs) and the decisions."""
    out = {}
    for key, k in _state(comm).items():
        med = {a: (statistics.median(s) / 1e3 if s else None) for a, s in k.samples.items()}
        out[key] = {"current": k.current, "table": k.table, "calls": k.calls,
                    "median_us": med, "history": list(k.history)}
    return out
