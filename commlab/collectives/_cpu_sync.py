"""``_sync``'s per-program epochs from the host, for the CPU backend's host twins.

The same flag words as the kernels (``_sync``'s layout, program 0 of a one-program
launch), so a call run by a twin and the next run by the interpreter (racecheck on,
``COMMLAB_CPU_TWINS=0``) agree on every counter and signal: a twin is the kernel's
program 0, executed as host code.
"""

from __future__ import annotations

import ctypes
import time

import torch

from commlab import _config
from commlab._interpreter import hostmem
from commlab.runtime.heap import MAX_BARRIER_BLOCKS, MAX_WORLD, RECORD_OFFSET, RECORD_RING

PHASES = 64
_BANK = MAX_BARRIER_BLOCKS * MAX_WORLD
_RECORDS = bool(_config.get("COMMLAB_RECORDS"))  # as cl.record_*: read at import


def _i64(addr: int) -> ctypes.c_int64:
    return ctypes.c_int64.from_address(addr)


class Program:
    """Program 0 of a one-program launch, over ``ctx`` (``comm.context``)."""

    def __init__(self, ctx: torch.Tensor):
        self.c = hostmem.Ctx(ctx)
        self.me, self.world = self.c.rank, self.c.world
        self.peers = [(self.me + i) % self.world for i in range(1, self.world)]
        self._rec = 0  # this launch's call record (begin_call opens it)

    def usable(self) -> bool:
        """A heap is registered (twins check every address against it)."""
        return self.c.size > 0

    def begin_call(self) -> int:
        """This program's call number n (>= 1): ``_sync.begin_call`` (which also opens
        the rank's call record, ``cl.record_begin``)."""
        if _RECORDS:
            rec = self.c.flags + RECORD_OFFSET
            k = _i64(rec).value + 1
            self._rec = slot = rec + 8 * (8 + 4 * ((k - 1) % RECORD_RING))
            _i64(slot + 16).value = 0
            _i64(slot + 24).value = 0
            _i64(slot + 8).value = time.monotonic_ns()
            _i64(slot).value = k
            _i64(rec).value = k
        return hostmem.int32(self.c.flags) + 1

    def end_call(self, n: int) -> None:
        hostmem.set_int32(self.c.flags, n)
        if _RECORDS:  # cl.record_end
            _i64(self._rec + 24).value = time.monotonic_ns()

    def _slot(self, src: int, bank: int) -> int:
        return self.c.flags + 4 * (MAX_BARRIER_BLOCKS + bank * _BANK + src)

    def signal_all(self, value: int, bank: int = 0) -> None:
        """Release to every peer: our stores so far are visible once it sees ``value``."""
        slot = self._slot(self.me, bank)
        hostmem.release_store([self.c.peer(slot, p) for p in self.peers], value)

    def wait_all(self, value: int, bank: int = 0) -> None:
        """Acquire from every peer: returns once each signalled ``value`` or more."""
        for src in self.peers:
            self.wait_from(src, value, bank)
        if _RECORDS and _i64(self._rec + 16).value == 0:  # cl.record_arrived
            _i64(self._rec + 16).value = time.monotonic_ns()

    def wait_from(self, src: int, value: int, bank: int = 0) -> None:
        """Acquire from rank ``src`` alone (``_sync.wait_from``)."""
        hostmem.wait_at_least(self._slot(src, bank), value)

    def local(self, t: torch.Tensor, offset: int, numel: int) -> torch.Tensor:
        """``numel`` elements of symmetric tensor ``t`` from element ``offset``, ours."""
        return self.c.tensor(t.data_ptr() + offset * t.element_size(), numel, t.dtype)

    def remote(self, t: torch.Tensor, offset: int, numel: int, p: int) -> torch.Tensor:
        """The same elements in rank ``p``'s heap (``cl.symm_at``)."""
        addr = self.c.peer(t.data_ptr() + offset * t.element_size(), p)
        return self.c.tensor(addr, numel, t.dtype, rank=p)


def reduce_into(out: torch.Tensor, parts: list[torch.Tensor], op: int) -> None:
    """``out = parts[0] (op) parts[1] (op) …`` in that order, floats in fp32 (the
    kernels' ``load_acc``/``combine``: 0 sum, 1 max, 2 min)."""
    acc_dtype = torch.float32 if parts[0].is_floating_point() else parts[0].dtype
    if len(parts) == 1:
        hostmem.store_cast(out, parts[0].to(acc_dtype))
        return
    if out.dtype == acc_dtype and out.is_contiguous():  # accumulate in place: no temporary
        acc = out
        _combine(parts[0], parts[1], op, acc)
    else:
        acc = torch.empty(out.shape, dtype=acc_dtype)
        _combine(parts[0].to(acc_dtype), parts[1], op, acc)
    for p in parts[2:]:
        _combine(acc, p, op, acc)
    if acc is not out:
        hostmem.store_cast(out, acc)


def _combine(a: torch.Tensor, b: torch.Tensor, op: int, out: torch.Tensor) -> None:
    if op == 0:
        torch.add(a, b, out=out)
    elif op == 1:
        torch.maximum(a, b, out=out)
    else:
        torch.minimum(a, b, out=out)
