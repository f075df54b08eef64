"""One rank's checker: program clocks, the access record, acquires and releases.

Every program instance of a launch gets its own clock component (rank, program), so
programs of one launch are concurrent, as on a GPU. A release atomic publishes the
releasing program's clock with the flag's new value in the shared sync log; an
acquire that sees the flag at the value it waits for merges the clock of the earliest
write that could have shown it that value (``_clock.acquired``); a value no logged
atomic wrote (the host's, a plain store's) is logged as a write without a clock.
Loads and stores on symmetric memory are recorded with the accessing program's clock;
``_races`` compares them.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from commlab._interpreter import programs
from commlab.racecheck import _clock, _races, _where

_SIGNED = {4: ctypes.c_int32, 8: ctypes.c_int64, 2: ctypes.c_int16, 1: ctypes.c_int8}


class Checker:
    def __init__(self, comm, shared, wait_timeout=None, seed=None):
        self.comm, self.shared = comm, shared
        self.rank, self.world = comm.rank, comm.world_size
        self.bases = [int(b) for b in comm.heap.bases]
        self.size = int(comm.heap.size)
        self.host = {(self.rank, -1): 1}
        self.wait_timeout = wait_timeout
        self.seed = seed  # the schedule's seed under shuffle=True, else None
        self.parked: dict = {}  # program -> (hint, waiting, blocked_since) while switched out
        # (owner, offset) -> the flag's writes in the order they took effect: (value after,
        # released clock|None, rank, writer component|None (not an atomic), its epoch)
        self.history: dict = {}
        self.records: dict = {}  # peer rank -> its accesses (and sync marks) to compare
        self.pending: list = []  # ours, not yet in the shared log
        self.mine_new: list = []  # ours from the current launch
        self.launch = None  # (number, kernel name, file:line, base clock, {pid: clock})
        self.launch_no = 0
        self.cur = None  # the running program's clock
        self.pid = None
        self.hint = None  # (addr, value): the cl.wait that is starting
        self.waiting = None  # what this program is blocked on, for the wait-for graph
        self.blocked_since = 0.0
        self.reported: set = set()
        self.accesses = 0  # symmetric-memory access ranges recorded (a health figure)
        self.acquires: dict = {}  # program -> acquires it completed in this launch

    # -- addresses --------------------------------------------------------------------
    def owner_of(self, addrs: np.ndarray):
        """(owner rank per lane or -1, offset per lane)."""
        owner = np.full(addrs.shape, -1, dtype=np.int64)
        off = np.zeros(addrs.shape, dtype=np.int64)
        for r, b in enumerate(self.bases):
            m = (addrs >= b) & (addrs < b + self.size)
            owner[m] = r
            off[m] = (addrs[m] - np.uint64(b)).astype(np.int64)
        return owner, off

    # -- launches and programs --------------------------------------------------------
    def begin_launch(self, fn, grid):
        self.launch_no += 1
        code = getattr(fn, "__code__", None)
        where = (f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
                 if code is not None else "line ?")
        self.launch = (self.launch_no, getattr(fn, "__name__", "kernel"), where,
                       dict(self.host), {})
        self.mine_new = []

    def begin_program(self, idx):
        if self.launch is None:
            return
        _, _, _, base, progs = self.launch
        comp = (self.rank, idx)
        clock = dict(base)
        clock[comp] = base.get(comp, 0) + 1
        progs[idx] = clock
        self.cur, self.pid = clock, idx
        self.hint, self.waiting = None, None
        self.acquires[idx] = 0

    def switch(self, event, idx):
        """A program of a cooperative launch hands the baton on ("out") or gets it back."""
        if self.launch is None:
            return
        if event == "out":
            self.parked[idx] = (self.hint, self.waiting, self.blocked_since)
            return
        self.cur, self.pid = self.launch[4][idx], idx
        self.hint, self.waiting, self.blocked_since = self.parked.pop(idx, (None, None, 0.0))

    def end_launch(self):
        if self.launch is None:
            return
        for clock in self.launch[4].values():
            _clock.join(self.host, clock)
        self.tick_host()
        self.flush()
        self.launch, self.cur, self.pid, self.hint, self.waiting = None, None, None, None, None
        self.parked, self.acquires = {}, {}

    def tick_host(self):
        comp = (self.rank, -1)
        self.host[comp] = self.host.get(comp, 0) + 1

    def _tick(self):
        comp = (self.rank, self.pid)
        self.cur[comp] = self.cur.get(comp, 0) + 1

    # -- plain loads and stores -------------------------------------------------------
    def access(self, acc, do):
        if self.cur is None:
            return do()
        addrs, isz = acc.lanes()
        if addrs.size:
            owner, off = self.owner_of(addrs)
            sym = owner >= 0
            if sym.any():
                if self.seed is not None:
                    programs.point()
                self._record(acc.kind == "store", owner[sym], off[sym], isz)
        return do()

    def _record(self, write, owner, off, isz):
        order = np.lexsort((off, owner))
        owner, off = owner[order], off[order]
        # coalesce touching lanes into ranges [lo, hi) per owner
        brk = np.nonzero((np.diff(owner) != 0) | (np.diff(off) > isz))[0] + 1
        starts = np.concatenate(([0], brk))
        ends = np.concatenate((brk, [len(off)]))
        where = _where.kernel_line()
        comp = (self.rank, self.pid)
        snap = dict(self.cur)
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            rec = (int(owner[s]), int(off[s]), int(off[e - 1]) + isz, write, self.rank,
                   self.pid, comp, self.cur[comp], snap, where, self.launch[:3],
                   self.acquires.get(self.pid, 0))
            self.pending.append(rec)
            self.mine_new.append(rec)
            self.accesses += 1

    def flush(self):
        if self.pending:
            self.shared.acc[self.rank].append(*self.pending)
            self.pending = []

    # -- atomics: the signals ---------------------------------------------------------
    def atomic(self, acc, do):
        if self.cur is None:
            return do()
        addrs, isz = acc.lanes()
        owner, off = self.owner_of(addrs)
        if addrs.size == 0 or (owner < 0).all():
            return do()
        if self.seed is not None:
            programs.point()
        sem = str(acc.sem).rsplit(".", 1)[-1]
        release, acquire = "RELEASE" in sem, "ACQUIRE" in sem
        if release:
            self.flush()  # our stores before the release are in the log before it lands
        sh = self.shared
        sh.lock()
        try:
            self._read_sync()
            out = do()
            old = np.asarray(out.data).reshape(-1)
            new_recs = []
            for lane in range(addrs.size):
                if owner[lane] < 0:
                    continue
                key = (int(owner[lane]), int(off[lane]))
                hist = self.history.setdefault(key, [])
                signed = _SIGNED.get(isz, ctypes.c_int32)
                was = signed(int(old[lane]) if old.size > lane else int(old[0])).value
                now = signed.from_address(int(addrs[lane])).value
                if not hist or hist[-1][0] != was:
                    # a write no atomic made (the host, a plain store, a launch before
                    # racecheck) put ``was`` there: it joins the flag's order of writes
                    rec = ("atomic", key, was, None, self.rank, None, 0)
                    hist.append(rec[2:])
                    new_recs.append(rec)
                if acquire:
                    self._acquire(acc, key, hist, was, int(addrs[lane]))
                if release or now != was:
                    comp = (self.rank, self.pid)
                    rec = ("atomic", key, now, dict(self.cur) if release else None, self.rank,
                           comp, self.cur[comp])
                    hist.append(rec[2:])
                    new_recs.append(rec)
            sh.sync.append(*new_recs)  # read back (and skipped) by our next refresh
        finally:
            sh.unlock()
        if release:
            self._tick()
        return out

    def _acquire(self, acc, key, hist, was, addr):
        if acc.kind == "atomic_cas":
            cmp = int(np.asarray(acc.cmp.data).reshape(-1)[0])
            if was != cmp:  # a failed CAS: still waiting
                return self._block(key, cmp, was, "==")
            threshold = was
        elif self.hint is not None and self.hint[0] == addr:
            threshold = self.hint[1]
            if was < threshold:
                return self._block(key, threshold, was, ">=")
        else:
            threshold = was
        self.hint = None
        self.waiting = None
        self.acquires[self.pid] = self.acquires.get(self.pid, 0) + 1
        _clock.join(self.cur, _clock.acquired(hist, threshold, self.cur))

    def _block(self, key, want, have, op):
        if self.waiting is None or self.waiting[0] != key:
            self.waiting = (key, want, _where.kernel_line(), self.pid, have, op)
            self.blocked_since = time.monotonic()
        else:
            self.waiting = (*self.waiting[:4], have, op)

    def blocked_programs(self) -> list:
        """(program, file:line, flag key, wanted, held, op) of every program of the
        running launch blocked in a wait: the running one and those switched out."""
        out = [] if self.waiting is None else [self.waiting]
        out += [w for _, w, _ in self.parked.values() if w is not None]
        return [(w[3], w[2], w[0], w[1], w[4], w[5]) for w in out]

    def _read_sync(self):
        for rec in self.shared.sync.refresh():
            if rec[0] == "atomic" and rec[4] != self.rank:
                self.history.setdefault(rec[1], []).append(rec[2:])

    # -- host synchronisation (agreement, commlab.barrier, collectives) ---------------
    def host_sync(self, event, rank, seq):
        if event == "publish":
            self.flush()
            self.shared.acc[self.rank].append(("sync", seq))
            sh = self.shared
            sh.lock()
            try:
                sh.sync.append(("sync", seq, self.rank, dict(self.host)))
            finally:
                sh.unlock()
            return
        sh = self.shared
        sh.lock()
        try:
            self._read_sync()
        finally:
            sh.unlock()
        for rec in self.shared.sync.records:
            if rec[0] == "sync" and rec[1] == seq:
                _clock.join(self.host, rec[3])
        self.tick_host()
        _races.forget_before(self, seq)
