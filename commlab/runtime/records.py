"""Call records: what every rank's collective kernels say about each call, read lazily.

Program 0 of every collective kernel (``cl.record_begin/arrived/end``; user kernels may
call them too) writes into its rank's heap, at the end of the flag area::

    int64 [count, 7 spare] [call, entry, arrived, end] x RECORD_RING [stamp] x 64

``entry`` when the kernel started on this rank, ``arrived`` when its first wait for every
peer completed, ``end`` when program 0 finished (ns: ``%globaltimer`` on GPUs, the
machine's monotonic clock under the interpreter, so ranks' clocks compare). The host
notes which records each call made (``Book.note``) and reads them only when asked
(``Book.collect``): on CPU straight from every rank's shared memory, on GPUs through one
asynchronous copy of every rank's ring into pinned memory, taken up at the next read once
its event completed (no synchronisation on the call path). From the records of one call:

    last rank      the rank whose entry is latest (the one the others waited for)
    late_ns        its entry minus the mean entry of the other ranks
    wire_ns        max end - max entry: the collective's own time, stragglers excluded
    busbw          bytes x nccl-tests' factor / wire time
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from commlab import _config, _interpreter
from commlab.runtime import _native
from commlab.runtime.heap import RECORD_OFFSET, RECORD_RING, RECORD_STAMPS

LAUNCHES = [0]  # recording kernel launches this process made (GPU: which record is whose)
_REC = 4  # ints per record
_RING_AT = 8  # ring's first int
_STAMPS_AT = _RING_AT + _REC * RECORD_RING
_WORDS = _STAMPS_AT + RECORD_STAMPS
BUS = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
       "reduce_scatter": lambda w: (w - 1) / w, "all_to_all": lambda w: (w - 1) / w,
       "broadcast": lambda w: 1.0}


_MODE = _config.get("COMMLAB_RECORDS")  # True, False or "cpu"; read at import
# the kernels' switch (commlab.language.RECORDS): "cpu" records in the interpreter only
_ENABLED = _MODE is True or _MODE == "cpu" and _interpreter.interpreting()


def enabled() -> bool:
    return _ENABLED


def launched(n: int = 1) -> None:
    """Count ``n`` launches of recording kernels (the launch paths call this)."""
    LAUNCHES[0] += n


_RECORDING: dict = {}


def records_kernel(kernel) -> bool:
    """Whether a ``@triton.jit`` kernel writes call records (its source opens one)."""
    hit = _RECORDING.get(kernel)
    if hit is None:
        src = getattr(kernel, "src", "") or ""
        hit = _RECORDING[kernel] = ("begin_call(" in src) or ("record_begin(" in src)
    return hit


@dataclass
class CallRecord:
    """One collective call as every rank's kernels recorded it (times in ns)."""

    op: str
    algorithm: str
    nbytes: int
    dtype: str
    call: int  # the record number of the call's first launch on every rank
    entry: list[int]
    arrived: list[int]
    end: list[int]
    meta: dict = field(default_factory=dict)
    span: int = 1  # the records the call opened: the next call's record number is call + span

    @property
    def world(self) -> int:
        return len(self.entry)

    @property
    def last_entry(self) -> int:
        """When the last rank entered the call (ns)."""
        return max(self.entry)

    @property
    def last_end(self) -> int:
        """When the last rank finished the call (ns)."""
        return max(self.end)

    @property
    def last_rank(self) -> int:
        return int(np.argmax(self.entry))

    @property
    def late_ns(self) -> float:
        """How much later the last rank entered than the others did, on average."""
        if self.world < 2:
            return 0.0
        last = self.last_rank
        others = [e for r, e in enumerate(self.entry) if r != last]
        return float(self.entry[last] - sum(others) / len(others))

    @property
    def skew_ns(self) -> int:
        return max(self.entry) - min(self.entry)

    @property
    def wire_ns(self) -> int:
        return max(1, max(self.end) - max(self.entry))

    @property
    def busbw_gbps(self) -> float:
        factor = BUS.get(self.op, lambda w: 1.0)(self.world)
        return self.nbytes * factor / self.wire_ns  # bytes per ns = GB/s

    def brief(self) -> Brief:
        """This call as ``Book.peek`` gives it."""
        return Brief(self.op, self.algorithm, self.nbytes, self.dtype, self.call, self.span,
                     self.last_entry, self.last_end)

    def to_dict(self) -> dict:
        return {"op": self.op, "algorithm": self.algorithm, "bytes": self.nbytes,
                "dtype": self.dtype, "call": self.call, "entry": self.entry,
                "arrived": self.arrived, "end": self.end, "last_rank": self.last_rank,
                "late_us": self.late_ns / 1e3, "wire_us": self.wire_ns / 1e3,
                "busbw_gbps": self.busbw_gbps}


class Brief(NamedTuple):
    """What ``Book.peek`` gives of a call: a ``CallRecord``'s names, its stamps reduced
    to the last rank's entry and end (all online selection reads)."""

    op: str
    algorithm: str
    nbytes: int
    dtype: str
    call: int
    span: int
    last_entry: int
    last_end: int


def _region(comm) -> torch.Tensor:
    lay = comm.heap.layout
    return comm.heap.region(lay.flags + RECORD_OFFSET, 8 * _WORDS, torch.int64)


class Book:
    """A communicator's call records on the host: calls noted, records collected."""

    KEEP = 4096

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.world = comm.rank, comm.world_size
        self.cpu = comm.backend != "cuda"
        self._local = _region(comm)
        self._words = self._local.numpy() if self.cpu else None  # CPU: the shared words
        self._base = LAUNCHES[0] - self.device_count() if not self.cpu else 0
        self.pending: deque = deque()  # (k0, k1, op, algorithm, nbytes, dtype, meta)
        self.done: deque[CallRecord] = deque(maxlen=self.KEEP)
        self.seen = 0  # records collected so far (all time)
        self._snap: tuple | None = None  # GPU: (event, pinned [W, words]) in flight
        self._views: list | None = None
        self._ring_views: tuple | None = None  # CPU: (rings, count words), numpy views
        # CPU: (C read, ring and count addresses); (): no C twin; None: not asked yet
        self._native: tuple | None = None
        self._lock = threading.Lock()  # collect: the caller's thread or a live view's
        self.wanted = False  # GPU: a live view asked for a collect at the next call

    # -- noting ------------------------------------------------------------------------
    def mark(self) -> int:
        """The number of records this rank's kernels have opened once the launches made
        so far run (CPU: read from memory, the interpreter has run them; GPU: counted)."""
        if self.cpu:
            return int(self._words[0])  # a numpy read: a tensor index costs more, every call
        return LAUNCHES[0] - self._base

    def device_count(self) -> int:
        return int(self._local[0].item()) if self.cpu else 0

    def note(self, k0: int, k1: int, op: str, algorithm: str, nbytes: int, dtype: str = "",
             meta: dict | None = None) -> None:
        """The call that opened records k0+1..k1 (none: nothing to note)."""
        if k1 > k0:
            self.pending.append((k0, k1, op, algorithm, nbytes, dtype, meta or {}))
            if len(self.pending) > self.KEEP:
                self.pending.popleft()
        if self.wanted and not torch.cuda.is_current_stream_capturing():
            self.wanted = False
            self.collect()

    def poll(self) -> None:
        """Collect for a reader in another thread (``%dist_watch`` through the engine's
        agent): on CPU now; on GPUs at this rank's next call (the thread that makes the
        calls owns the copies, and a capture must not see them)."""
        if self.cpu:
            self.collect()
        else:
            self.wanted = True

    def forget(self, mark: int) -> None:
        """Leave unread the noted calls that opened records past ``mark`` (a ``mark()``
        taken earlier and not yet collected: a benchmark's calls that are not a reader's
        to learn from)."""
        with self._lock:
            while self.pending and self.pending[-1][0] >= mark:
                self.pending.pop()

    def since(self, seen: int, limit: int = 512) -> list[CallRecord]:
        """The records collected after the first ``seen`` (all time), the newest
        ``limit`` of them."""
        with self._lock:
            done, total = list(self.done), self.seen
        n = min(total - seen, len(done), limit)
        return done[len(done) - n:] if n > 0 else []

    def peek(self, n: int, after: int = 0) -> list[Brief]:
        """The newest ``n`` complete calls from record number ``after`` on, oldest first,
        in brief, without collecting: those already collected and the pending ones read
        where they lie (a later ``collect`` still hands those to its caller). For a
        reader that needs only the calls' costs (online selection). GPUs: the collected
        ones only (their rings come as asynchronous copies, each taken up by the next
        collect)."""
        with self._lock:
            done = [r.brief() for r in itertools.islice(
                itertools.takewhile(lambda r: r.call >= after, reversed(self.done)), n)][::-1]
            tail = list(itertools.islice(itertools.takewhile(
                lambda e: e[0] + 1 >= after, reversed(self.pending)), n))[::-1]
            if not (tail and self.cpu):
                return done
            read = _read(tail, self._marks, brief=True)
            gone = max((i for i, r in enumerate(read) if r is None), default=-1)
            return (done + read[gone + 1:])[-n:]  # only the calls after a lost one

    # -- reading -----------------------------------------------------------------------
    def _peer_views(self) -> list[torch.Tensor]:
        if self._views is None:
            from commlab.runtime.peer import peer_view  # noqa: PLC0415 (peer needs a comm)
            self._views = [self._local if r == self.rank else peer_view(self.comm, self._local, r)
                           for r in range(self.world)]
        return self._views

    def _rings(self) -> tuple[list, list] | None:
        """Every rank's record ring, [RECORD_RING, (call, entry, arrived, end)] each, and
        its count word: CPU, views of the shared words (read where they lie); GPUs, the
        copy started at the previous read, or None while it is in flight."""
        if self.cpu:
            return self._cpu_rings()
        views = self._peer_views()
        snap, self._snap = self._snap, None
        got = None
        if snap is not None:
            event, pinned = snap
            if event.query():
                got = _ring_views(list(pinned.numpy().copy()))
            else:
                self._snap = snap
                return None
        self._start_copy(views)
        return got

    def _cpu_rings(self) -> tuple[list, list]:
        """CPU: ``_rings``, views of every rank's shared words (made once)."""
        if self._ring_views is None:
            self._ring_views = _ring_views([v.numpy() for v in self._peer_views()])
        return self._ring_views

    def _marks(self, ks: range, brief: bool) -> tuple | None:
        """``_marks`` of records ``ks`` on every rank; None while a GPU copy is in flight.
        CPU, in brief: read in C where the C twin is built (one decision's read is rank
        0's time on every CPU rank's critical path)."""
        if brief and self.cpu and self._native != ():
            if self._native is None:
                mod = _native.module()
                rings, counts = self._cpu_rings()
                self._native = () if mod is None else (
                    mod.records_brief, tuple(r.ctypes.data for r in rings),
                    tuple(c.ctypes.data for c in counts))
            if self._native:
                fn, rings, counts = self._native
                status, firsts, lasts = fn(rings, counts, ks[0], len(ks), RECORD_RING)
                return status, (firsts, lasts)
        got = self._rings()
        return None if got is None else _marks(*_gather(*got, ks), ks, brief)

    def _start_copy(self, views) -> torch.cuda.Event:
        dev = self.comm.device
        pinned = torch.empty((self.world, _WORDS), dtype=torch.int64, pin_memory=True)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))  # after the calls made so far
        with torch.cuda.stream(side):
            for r, v in enumerate(views):
                pinned[r].copy_(v, non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        self._snap = (event, pinned)
        return event

    def settle(self) -> None:
        """Wait until the next ``collect`` hands out every call made so far whose records
        every rank has finished. GPUs: drops the copy in flight and takes a fresh one,
        waiting for it (a synchronisation: for debugging reads such as ``recent`` and
        checks, never the call path). CPU: nothing to wait for."""
        if self.cpu:
            return
        with self._lock:
            if self._snap is not None:
                self._snap[0].synchronize()  # its pinned memory may still be written
            self._start_copy(self._peer_views()).synchronize()

    def collect(self) -> list[CallRecord]:
        """The calls whose records every rank has completed since the last collect (never
        waits: on GPUs the records of the copy started at the previous collect)."""
        with self._lock:
            return self._collect()

    def _collect(self) -> list[CallRecord]:
        if not self.pending:
            return []
        out: list[CallRecord] = []
        for rec in _read(list(self.pending), self._marks):
            self.pending.popleft()
            if rec is not None:  # None: overwritten or mismatched, given up
                out.append(rec)
        self.done.extend(out)
        self.seen += len(out)
        return out


def _read(entries: list, marks, brief: bool = False) -> list:
    """The records of the noted calls ``entries`` (oldest first), their states and
    stamps from ``marks`` (``Book._marks``), up to the first that some rank has not
    finished: per call its CallRecord (``brief``: its Brief), or None where the ring went
    round (lost). [] while a GPU copy is in flight."""
    ks = range(entries[0][0] + 1, entries[-1][1] + 1)
    got = marks(ks, brief)
    if got is None:
        return []
    status, stamps = got
    k_lo = ks[0]
    out: list = []
    for k0, k1, op, alg, nbytes, dtype, meta in entries:
        a, b = k0 + 1 - k_lo, k1 + 1 - k_lo
        part = status[a:b]
        if LOST in part:
            out.append(None)
            continue
        if WAITING in part:
            break
        if brief:
            out.append(Brief(op, alg, nbytes, dtype, k0 + 1, k1 - k0, stamps[0][a],
                             stamps[1][b - 1]))
        else:
            first, last = stamps[a], stamps[b - 1]
            out.append(CallRecord(op, alg, nbytes, dtype, k0 + 1, first[0], first[1], last[2],
                                  meta, k1 - k0))
    return out


def _ring_views(words: list[np.ndarray]) -> tuple[list, list]:
    """Per rank's words [words]: its ring as a [RECORD_RING, (call, entry, arrived, end)]
    view and its count word (a view: read when used)."""
    return ([w[_RING_AT:_STAMPS_AT].reshape(RECORD_RING, _REC) for w in words],
            [w[:1] for w in words])


def _gather(rings: list, counts: list, ks: range) -> tuple[np.ndarray, int]:
    """The slots of records ``ks`` in ``rings`` (``_ring_views``), [W, len(ks), 4] (a copy:
    the ranks write on), and the most records a rank has opened, read after them (a slot
    rewritten while it was copied reads as lost)."""
    i0, n = (ks[0] - 1) % RECORD_RING, len(ks)
    if i0 + n <= RECORD_RING:  # one stretch of the ring (most reads): slices
        rows = np.stack([r[i0:i0 + n] for r in rings])
    else:
        at = (np.arange(ks[0], ks[0] + n) - 1) % RECORD_RING
        rows = np.stack([r[at] for r in rings])
    return rows, max(int(c[0]) for c in counts)


WAITING, READY, LOST = 0, 1, 2  # a record's state (``_marks``)


def _marks(rows: np.ndarray, count: int, ks: range, brief: bool) -> tuple[list, list]:
    """For records ``ks`` whose slots on every rank are ``rows`` [W, record, (call,
    entry, arrived, end)], ``count`` the most records a rank has opened: each one's state
    (LOST: the ring went round, its slot holds a later call's; READY: every rank
    completed it; else WAITING) and its stamps: [record][entry, arrived, end][rank], or
    in ``brief`` (the latest entry of each record, the latest end). The C twin's
    ``records_brief`` reads the same in brief."""
    k = np.arange(ks[0], ks[-1] + 1)
    calls = rows[:, :, 0]
    lost = (calls > k).any(axis=0) | (k <= count - RECORD_RING)
    ready = ((calls == k) & (rows[:, :, 3] != 0)).all(axis=0)
    status = np.where(lost, LOST, np.where(ready, READY, WAITING)).tolist()
    if brief:
        return status, [rows[:, :, 1].max(axis=0).tolist(), rows[:, :, 3].max(axis=0).tolist()]
    return status, rows[:, :, 1:].transpose(1, 2, 0).tolist()


def book(comm) -> Book | None:
    """The communicator's Book (made at the first use; None when records are off or the
    world spans hosts: a kernel's records then cover only its host)."""
    if not enabled() or comm is None or comm.local is not comm:
        return None
    b = getattr(comm, "records", None)
    if b is None:
        b = Book(comm)
        comm.records = b
    return b


def stamps(comm) -> list[int]:
    """This rank's user stamps (``cl.timestamp(ctx, slot)``), ns, 0 where never stamped
    (GPU: synchronises with the device: a debugging read, not for the call path)."""
    t = _region(comm)[_STAMPS_AT:_STAMPS_AT + RECORD_STAMPS]
    return [int(v) for v in t.cpu().tolist()]


def collect(comm) -> list[CallRecord]:
    """New complete call records of ``comm`` (see ``Book.collect``)."""
    b = book(comm)
    return b.collect() if b is not None else []


def recent(comm) -> list[CallRecord]:
    """Every call record kept (the last ``Book.KEEP``), collecting new ones first (GPUs:
    waits for the device, so every finished call is there: a debugging read)."""
    b = book(comm)
    if b is None:
        return []
    b.settle()
    b.collect()
    return list(b.done)
