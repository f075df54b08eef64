"""The fused kernels' GEMM without their communication: the same tile order, main loop
and tile configuration, over a plain [M, K] @ [K, N].

It answers the first question about an overlapped kernel: how much of its time is the
Triton GEMM itself (against cuBLAS) and how much is communication it did not hide.
``commlab.bench.overlap`` times it as impl "triton_gemm_only"; notebooks/05-overlap
reads those records.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from commlab.overlap import _launch, _operands
from commlab.overlap._tiles import grouped_tile, mma, store_tile, tail_combine, tail_part


@triton.jit
def gemm_kernel(
    a_src, b_src, out,  # A [M, K] and B as in the fused kernels; out [M, N] (store_tile)
    ws_ptr, cnt_ptr,  # split-tail workspace (tail_combine)
    M, N, K,
    stride_bk, stride_bn,
    DP_TILES, SPLIT,  # the schedule (_launch.schedule)
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, B_TRANS: tl.constexpr,
    OUT_TMA: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    KI = (K + BK - 1) // BK
    for tile in tl.range(pid, DP_TILES, nprog):  # whole tiles
        pid_m, pid_n = grouped_tile(tile, M, N, BM, BN, GROUP_M)
        acc = mma(a_src, pid_m * 0, M, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n,
                  0, KI, BM, BN, BK, EVEN_K, USE_TMA, B_TRANS)
        store_tile(out, pid_m * 0, M, N, pid_m, pid_n, acc, BM, BN, OUT_TMA)
    # the partial last wave, split along K (a loop of 0 or 1 trips, the same structure
    # as the loop above)
    j, k_lo, k_hi, n = tail_part(tiles - DP_TILES, KI, SPLIT)
    for _ in range(0, n):
        pid_m, pid_n = grouped_tile(DP_TILES + j, M, N, BM, BN, GROUP_M)
        acc = mma(a_src, pid_m * 0, M, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n,
                  k_lo, k_hi, BM, BN, BK, EVEN_K, USE_TMA, B_TRANS)
        acc, done = tail_combine(ws_ptr, cnt_ptr, acc, j, tiles - DP_TILES, SPLIT, BM, BN)
        if done:
            store_tile(out, pid_m * 0, M, N, pid_m, pid_n, acc, BM, BN, OUT_TMA)


def matmul(comm, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` by the fused kernels' GEMM (local; no communication)."""
    a = a.contiguous()
    m, k = a.shape
    n = b.shape[1]
    cfg = _launch.tile_config(comm)
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    ops = _operands.operands(comm, cfg, a, b)
    dst, out_tma = _operands.output(ops, cfg, out, m)
    sched = _launch.schedule(comm, cfg, triton.cdiv(m, cfg.BM) * triton.cdiv(n, cfg.BN), k)
    ws, cnt = _launch.tail_workspace(comm, sched, cfg)
    gemm_kernel[(sched.programs,)](
        ops.a, ops.b, dst, ws, cnt, m, n, k, b.stride(0), b.stride(1),
        sched.dp_tiles, sched.split,
        BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, GROUP_M=cfg.GROUP_M, EVEN_K=k % cfg.BK == 0,
        USE_TMA=ops.tma, B_TRANS=ops.b_trans, OUT_TMA=out_tma, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
