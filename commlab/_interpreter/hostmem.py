"""Host access to the symmetric heaps for host twins (``twins``): tensor views of any
rank's heap, flag signals and waits through the interpreter's own C++ atomics (so the
memory order is the kernel's: release on a signal, acquire on a wait, on any CPU).

Every address a twin touches is checked to lie in a heap first (the check ``cl.symm_at``
makes under the interpreter, ``bounds``); a wait registers with ``blocked`` once it has
polled ``blocked.REGISTER_S`` and asks ``liveness`` (a lost peer, the timeout), as
``cl.wait``'s host poll does.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import torch
import triton.language as tl
from triton._C.libtriton import interpreter as _atomics
from triton.runtime.interpreter import _convert_float

from commlab._interpreter import blocked, bounds, liveness
from commlab.errors import CommlabUsageError

_HEAPS: dict[tuple[int, int], torch.Tensor] = {}  # (base, size) -> uint8 view of a heap
_ONE = np.ones(1, dtype=bool)
_ZERO = np.zeros(1, dtype=np.int32)


class Ctx:
    """``comm.context`` read once per launch: rank, world, flag area, every heap base."""

    __slots__ = ("rank", "world", "flags", "bases", "size")

    def __init__(self, ctx: torch.Tensor):
        v = ctx.tolist()
        self.rank, self.world, self.flags = int(v[0]), int(v[1]), int(v[3])
        self.bases = v[4:4 + self.world]
        self.size = bounds.heap_size()

    def peer(self, addr: int, p: int) -> int:
        """``cl.symm_at``: the same heap location on rank ``p``."""
        return addr - self.bases[self.rank] + self.bases[p]

    def tensor(self, addr: int, numel: int, dtype: torch.dtype, rank: int | None = None):
        """``numel`` elements of ``dtype`` at ``addr`` in rank ``rank``'s heap (default:
        ours) as a tensor over that memory; raises unless the span lies in the heap."""
        r = self.rank if rank is None else rank
        base, nbytes = self.bases[r], numel * dtype.itemsize
        off = addr - base
        if not (0 <= off and off + nbytes <= self.size):
            raise CommlabUsageError(
                f"rank {self.rank}: [{addr:#x}, {addr + nbytes:#x}) is outside rank {r}'s "
                f"symmetric heap [{base:#x}, {base + self.size:#x}); pass a tensor from "
                f"commlab.symmetric_empty/zeros")
        heap = _HEAPS.get((base, self.size))
        if heap is None:
            buf = (ctypes.c_uint8 * self.size).from_address(base)
            heap = _HEAPS[(base, self.size)] = torch.frombuffer(buf, dtype=torch.uint8)
        return heap[off:off + nbytes].view(dtype)


def int32(addr: int) -> int:
    """A plain load of the int32 at ``addr`` (a program's own counter)."""
    return ctypes.c_int32.from_address(addr).value


def set_int32(addr: int, value: int) -> None:
    ctypes.c_int32.from_address(addr).value = value


def release_store(addrs: list[int], value: int) -> None:
    """Atomic exchange of ``value`` into every int32 in ``addrs``, release: every store
    made before is visible to whoever acquires one of them (``cl.notify``'s "set")."""
    k = len(addrs)
    if k:
        _atomics.atomic_rmw(_atomics.RMW_OP.XCHG, np.array(addrs, dtype=np.uint64),
                            np.full(k, value, dtype=np.int32), np.ones(k, dtype=bool),
                            _atomics.MEM_SEMANTIC.RELEASE)


def acquire_load(addr: int) -> int:
    return int(_atomics.atomic_rmw(_atomics.RMW_OP.ADD, np.array([addr], dtype=np.uint64),
                                   _ZERO, _ONE, _atomics.MEM_SEMANTIC.ACQUIRE)[0])


def wait_at_least(addr: int, want: int, program=0) -> None:
    """``cl.wait``: return once the int32 at ``addr`` is >= ``want`` (acquire). Polls
    with plain reads (a fraction of a microsecond each) and yields the core between
    polls, sleeping after a short burst (ranks may outnumber cores); the final read is
    the acquire."""
    cell = ctypes.c_int32.from_address(addr)
    polls, start = 0, 0.0
    while cell.value < want:
        polls += 1
        if polls <= 4:
            os.sched_yield()
            continue
        blocked.poll(addr, want, ">=", "wait", program)
        liveness.check(addr, want)
        now = time.monotonic()
        if not start:
            start = now
        time.sleep(0.00005 if now - start < 0.002 else 0.0002)
    acquire_load(addr)  # values only grow: this reads >= want and orders what follows


def store_cast(out: torch.Tensor, acc: torch.Tensor) -> None:
    """``out = acc.to(out.dtype)`` with the interpreter's rounding: its fp32 -> bf16 cast
    truncates (Triton's ``_convert_float`` without a rounding mode), torch's rounds to
    nearest; every other cast is numpy's, which rounds as torch does."""
    if out.dtype != torch.bfloat16 or acc.dtype != torch.float32:
        out.copy_(acc)
        return
    bits = _convert_float(acc.contiguous().numpy(), tl.float32, tl.bfloat16, None)
    out.view(torch.int16).copy_(torch.from_numpy(bits.view(np.int16)))


def forget() -> None:
    """The twin's launch ended: its wait (if one was registered) is over."""
    blocked.forget()
