"""The symmetric heap: one equally sized buffer per rank, every rank able to address all.

Layout, identical on every rank (offsets are what makes a location "symmetric")::

    [ signal pad | collective flags | staging scratch | user arena ........ ]
      cl.barrier   per-op counters    commlab stages     symmetric_empty()
                                      inputs here        allocations

The user arena is a first-fit allocator with coalescing. Allocation is collective:
every rank must allocate the same sizes in the same order, and the communicator checks
that every rank got the same offset. A block is freed when the last tensor viewing it
is garbage-collected.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commlab.errors import HeapFullError

ALIGN = 256
MAX_WORLD = 64
MAX_BARRIER_BLOCKS = 256
SIGNAL_PAD_BYTES = MAX_BARRIER_BLOCKS * MAX_WORLD * 4  # int32 per (block, peer)
MAX_CE_CHUNKS = 16


def _round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


# call counters, then two banks of arrival slots [program, source rank] (collectives/_sync.py),
# then the copy-engine exchanges' counter and flags [source rank, chunk] (_copy_engine.py):
# zeroed at init and by recover(), never allocated inside a CUDA-graph capture
CE_FLAGS_OFFSET = (MAX_BARRIER_BLOCKS + 2 * MAX_BARRIER_BLOCKS * MAX_WORLD) * 4
CE_FLAGS_INTS = 1 + MAX_WORLD * MAX_CE_CHUNKS
# then the call records (runtime/records.py): a counter, a ring of RECORD_RING int64
# [call, entry, arrived, end], and RECORD_STAMPS user timestamps (cl.timestamp)
RECORD_OFFSET = CE_FLAGS_OFFSET + _round_up(CE_FLAGS_INTS * 4)
RECORD_RING = 256
RECORD_INTS = 8 + 4 * RECORD_RING + 64  # counter row (8), ring, stamps
RECORD_STAMPS = 64
FLAGS_BYTES = RECORD_OFFSET + _round_up(RECORD_INTS * 8)


assert (SIGNAL_PAD_BYTES + FLAGS_BYTES) % ALIGN == 0, "scratch must start ALIGN-aligned"


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class HeapLayout:
    size: int
    scratch_bytes: int

    @property
    def signal_pad(self) -> int:
        return 0

    @property
    def flags(self) -> int:
        return SIGNAL_PAD_BYTES

    @property
    def scratch(self) -> int:
        return SIGNAL_PAD_BYTES + FLAGS_BYTES

    @property
    def arena(self) -> int:
        return _round_up(self.scratch + self.scratch_bytes)

    def check(self) -> None:
        if self.arena >= self.size:
            raise ValueError(
                f"heap_size {_fmt_bytes(self.size)} leaves no room for the user arena after "
                f"the signal pad, flags and {_fmt_bytes(self.scratch_bytes)} of scratch; "
                f"pass a larger heap_size or a smaller scratch_size"
            )


class Arena:
    """First-fit free list over [start, end), offsets aligned to ALIGN bytes."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end
        self._free: list[tuple[int, int]] = [(start, end - start)]  # sorted (offset, size)
        self._used: dict[int, int] = {}

    @property
    def free_bytes(self) -> int:
        return sum(s for _, s in self._free)

    @property
    def largest_free(self) -> int:
        return max((s for _, s in self._free), default=0)

    def alloc(self, nbytes: int) -> int:
        need = _round_up(max(nbytes, 1))
        for i, (off, size) in enumerate(self._free):
            if size >= need:
                if size == need:
                    del self._free[i]
                else:
                    self._free[i] = (off + need, size - need)
                self._used[off] = need
                return off
        raise HeapFullError(
            f"symmetric heap full: requested {_fmt_bytes(nbytes)} ({nbytes} B), free "
            f"{_fmt_bytes(self.free_bytes)} of which the largest block is "
            f"{_fmt_bytes(self.largest_free)}; free symmetric tensors you no longer use "
            f"or pass a larger heap_size to commlab.init()"
        )

    def block_at(self, off: int) -> tuple[int, int] | None:
        """(start, size) of the allocated block holding byte ``off``, or None."""
        for start, size in self._used.items():
            if start <= off < start + size:
                return start, size
        return None

    def free(self, off: int) -> None:
        size = self._used.pop(off)
        i = bisect.bisect_left(self._free, (off, 0))
        self._free.insert(i, (off, size))
        # coalesce with the right, then the left neighbour
        if i + 1 < len(self._free) and off + size == self._free[i + 1][0]:
            self._free[i] = (off, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == off:
            po, ps = self._free[i - 1]
            self._free[i - 1] = (po, ps + self._free[i][1])
            del self._free[i]


class SymmetricHeap:
    """A rank's view of the heap: its local buffer, every rank's base address, an arena.

    ``make_block(offset, nbytes)`` is backend-specific: it returns an object that owns a
    reference to the memory and from which a uint8 tensor is built; the block is freed
    when that object dies, i.e. when the last tensor (or view) using it dies.
    """

    def __init__(
        self,
        layout: HeapLayout,
        rank: int,
        bases: list[int],
        device: torch.device,
        local: torch.Tensor,
        make_block: Callable[[int, int], tuple[object, torch.Tensor]],
    ):
        self.layout = layout
        self.rank = rank
        self.bases = bases
        self.device = device
        self.local = local  # uint8 tensor over the whole local buffer
        self._make_block = make_block
        self.arena = Arena(layout.arena, layout.size)
        self.closed = False
        self.fd: int | None = None  # cpu: an open fd of this rank's segment (a grow maps it)
        self.inherited: dict[int, torch.Tensor] = {}  # a newcomer's blocks held since its join

    @property
    def size(self) -> int:
        return self.layout.size

    def region(self, offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        """A view of a fixed region (signal pad, flags, scratch) as ``dtype``."""
        return self.local[offset : offset + nbytes].view(dtype)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        numel = 1
        for s in shape:
            numel *= int(s)
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * elem
        off = self.arena.alloc(nbytes)
        owner, raw = self._make_block(off, max(nbytes, 1))
        weakref.finalize(owner, self._release, off)
        return raw[:nbytes].view(dtype).view(shape), off

    def _release(self, off: int) -> None:
        if not self.closed:
            self.arena.free(off)

    def offset_of(self, t: torch.Tensor) -> int | None:
        """Byte offset of ``t``'s first element inside the local heap, or None if outside."""
        addr = t.data_ptr()
        base = self.bases[self.rank]
        if base <= addr < base + self.size:
            return addr - base
        return None
