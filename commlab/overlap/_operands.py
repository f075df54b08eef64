"""What the kernels read A and B through and store their tiles through: TMA
descriptors on GPU where that is exact, else plain tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from commlab.overlap._launch import TileConfig
from commlab.overlap._launch import use_tma as target_has_tma
from commlab.runtime import Communicator


@dataclass
class Operands:
    """What the kernels read A and B through: TMA descriptors on GPU when the rows are
    16-byte aligned (the fast path), else plain tensors (pointers)."""

    a: object
    b: object
    extra: object  # a second A source (ag_gemm's gathered buffer), or None
    tma: bool
    b_trans: bool


_DESCRIPTORS: dict = {}  # host-side TMA descriptors by (address, shape, strides, block)


def tma_ok(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and (t.shape[-1] * t.element_size()) % 16 == 0


def descriptor(t: torch.Tensor, block):
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, tuple(block))
    if key not in _DESCRIPTORS:
        if len(_DESCRIPTORS) > 64:
            _DESCRIPTORS.clear()
        _DESCRIPTORS[key] = TensorDescriptor.from_tensor(t, block)
    return _DESCRIPTORS[key]


def output(ops: Operands, cfg: TileConfig, out: torch.Tensor, rows: int):
    """(what a kernel stores its [rows, N] tiles through, whether it is a TMA descriptor).

    With TMA loads, the tiles are stored through a descriptor too when that is exact:
    TMA clips at the tensor's edge, so a chunk of a taller output (ag_gemm) needs rows
    that are a multiple of BM. Measured on one H200 (bench/probes/gpu_gemm_variants.py,
    bench/results/gemm-variants-h200.json): 1.3% faster than a pointer store for the
    8B all-gather GEMM, 0.9% for the reduce-scatter one."""
    if ops.tma and tma_ok(out) and (out.shape[0] == rows or rows % cfg.BM == 0):
        return descriptor(out, [cfg.BM, cfg.BN]), True
    return out, False


def operands(comm: Communicator, cfg: TileConfig, a: torch.Tensor, b: torch.Tensor,
             extra: torch.Tensor | None = None) -> Operands:
    b_trans = not b.is_contiguous() and b.t().is_contiguous()
    bb = b.t() if b_trans else b
    use_tma = (comm.backend == "cuda" and target_has_tma(comm) and bb.is_contiguous()
               and tma_ok(a) and tma_ok(bb)
               and (extra is None or tma_ok(extra)))
    if not use_tma:
        return Operands(a, b, extra, False, False)
    b_block = [cfg.BN, cfg.BK] if b_trans else [cfg.BK, cfg.BN]
    return Operands(descriptor(a, [cfg.BM, cfg.BK]), descriptor(bb, b_block),
                    None if extra is None else descriptor(extra, [cfg.BM, cfg.BK]), True, b_trans)
