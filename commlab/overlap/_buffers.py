"""The per-shape symmetric buffers of the overlapped ops: double-buffered data, epoch
flags, the copy-engine side stream and peer views; allocated collectively, cached."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from commlab.collectives.barrier import barrier
from commlab.runtime import Communicator, symmetric_empty, symmetric_zeros
from commlab.runtime.peer import peer_view


@dataclass
class Buffers:
    """Symmetric buffers of one (op, shape, dtype, tiles), allocated collectively.

    ``data`` is double-buffered by call parity; ``flags`` hold epochs (call numbers),
    so a waiter compares with ``>= epoch`` and nothing is ever reset."""

    comm: Communicator
    data: torch.Tensor  # [2, W, rows, cols]
    flags: torch.Tensor  # int32 [W, n_flags]
    epoch: int = 0
    _cache: dict = field(default_factory=dict)  # side stream, peer views (host time matters)

    def next_epoch(self) -> int:
        self.epoch += 1
        return self.epoch

    def side_stream(self) -> torch.cuda.Stream:
        """The stream this buffer's copy-engine producer runs on (CUDA)."""
        if "stream" not in self._cache:
            self._cache["stream"] = torch.cuda.Stream(self.comm.device)
        return self._cache["stream"]

    def on_peer(self, slot: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(``slot`` of ``data``, ``flags``) as they live on rank p: host copies into
        them are copy-engine copies (CUDA) or memcpys into shared memory (CPU). The
        flags are uint32 on CUDA, the type stream writes take."""
        key = (p, slot.data_ptr())
        if key not in self._cache:
            flags = torch.uint32 if self.comm.backend == "cuda" else None
            self._cache[key] = (peer_view(self.comm, slot, p),
                                peer_view(self.comm, self.flags, p, flags))
        return self._cache[key]


_CACHE: OrderedDict = OrderedDict()
_CACHE_PER_OP = 1  # big buffers: keep the last shape of each op


def buffers(comm: Communicator, op: str, rows: int, cols: int, dtype: torch.dtype,
            n_flags: int) -> Buffers:
    """The cached buffers for this shape (allocating them collectively if new).

    Every rank reaches here with the same arguments (``agree`` ran first), so every
    rank allocates, evicts and counts epochs in the same order."""
    if any(b.comm is not comm for b in _CACHE.values()):
        _CACHE.clear()  # a new communicator (finalize + init): the old heap is gone
    key = (op, rows, cols, dtype, n_flags)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    same_op = [k for k in _CACHE if k[0] == op]
    if len(same_op) >= _CACHE_PER_OP:
        comm.synchronize()
        barrier()  # no rank's kernel still reads or writes the buffers we drop
        for k in same_op[: len(same_op) - _CACHE_PER_OP + 1]:
            del _CACHE[k]
    data = symmetric_empty((2, comm.world_size, rows, cols), dtype)
    flags = symmetric_zeros((comm.world_size, n_flags), torch.int32)
    _CACHE[key] = Buffers(comm, data, flags)
    return _CACHE[key]


def clear_cache() -> None:
    """Drop cached buffers (tests and commlab.finalize() users)."""
    _CACHE.clear()
