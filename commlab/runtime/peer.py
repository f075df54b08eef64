"""A symmetric tensor as it lives on another rank, addressed from this process.

Every rank maps every other rank's heap (CUDA: PyTorch symmetric memory; CPU: the
shared-memory segments), so ``peer_view(comm, t, p)`` is an ordinary tensor whose
storage is rank p's copy of ``t``. Host-side copies into it are copy-engine copies on
GPU (``cudaMemcpyAsync`` over NVLink) and plain memcpys on CPU.
"""

from __future__ import annotations

import ctypes

import torch

from commlab.errors import CommlabUsageError


class _CudaPtr:
    """A CUDA pointer (here: a peer's heap, mapped in this process) seen by torch."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def peer_view(comm, t: torch.Tensor, peer: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` (a contiguous symmetric tensor) on rank ``peer``; ``dtype`` reinterprets it
    (same element size, e.g. int32 flags as uint32 for stream writes)."""
    if comm.local is not comm:
        raise CommlabUsageError(
            f"peer_view: this world spans {len(comm.hosts)} hosts and a rank maps only its "
            f"host's heaps; pass comm.local and a rank of this host (0..."
            f"{comm.local.world_size - 1})")
    off = comm.heap.offset_of(t)
    if off is None:
        raise ValueError("peer_view: the tensor is not in the symmetric heap; allocate it "
                         "with commlab.symmetric_empty")
    addr = comm.heap.bases[peer] + off
    nbytes = t.numel() * t.element_size()
    if comm.backend == "cuda":
        raw = torch.as_tensor(_CudaPtr(addr, max(nbytes, 1)), device=comm.device)[:nbytes]
    else:
        raw = torch.frombuffer((ctypes.c_uint8 * max(nbytes, 1)).from_address(addr),
                               dtype=torch.uint8)[:nbytes]
    return raw.view(dtype or t.dtype).view(t.shape)
