"""Two-shot all-reduce: reduce-scatter, then all-gather, through the heap.

Rank r owns chunk r of the N elements. Each rank reads only N·(W-1)/W elements per phase,
so it moves 2·N·(W-1)/W in total against one-shot's N·(W-1): better from mid sizes up.

    stage x into my scratch
    barrier                      # inputs staged
    scratch[chunk me] = reduce over r of scratch@r[chunk me]
    barrier                      # every owner's chunk is reduced
    out[chunk c] = scratch@c[chunk c]   for every c
    barrier                      # peers finished reading our scratch
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import combine, launch_for, load_acc, peer_ptr


@triton.jit
def two_shot_all_reduce_kernel(
    # Symmetric buffers
    scratch_ptr,  # [N] staged input; chunk `me` is overwritten by its reduction
    # Local buffers
    out_ptr,  # [N]
    ctx,
    # Sizes
    N,
    CHUNK,  # elements per rank's chunk: ceil(N / W)
    # Meta-parameters
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    cl.barrier(ctx)  # inputs staged: peers may read ours
    # --- reduce-scatter: reduce my chunk from every rank into my scratch
    lo = me * CHUNK
    for start in range(pid * BLOCK, CHUNK, nprog * BLOCK):
        offs = lo + start + tl.arange(0, BLOCK)
        mask = (offs < N) & (offs < lo + CHUNK)
        acc = load_acc(scratch_ptr + offs, mask)
        for i in range(1, world):
            src = peer_ptr(scratch_ptr, (me + i) % world, ctx)
            acc = combine(acc, load_acc(src + offs, mask), OP)
        res = acc.to(out_ptr.dtype.element_ty)
        tl.store(scratch_ptr + offs, res, mask=mask)
        tl.store(out_ptr + offs, res, mask=mask)
    cl.barrier(ctx)  # every chunk is reduced at its owner: gather them
    # --- all-gather: copy chunk c from its owner c
    for i in range(1, world):
        c = (me + i) % world
        src = peer_ptr(scratch_ptr, c, ctx)
        for start in range(pid * BLOCK, CHUNK, nprog * BLOCK):
            offs = c * CHUNK + start + tl.arange(0, BLOCK)
            mask = (offs < N) & (offs < (c + 1) * CHUNK)
            tl.store(out_ptr + offs, tl.load(src + offs, mask=mask), mask=mask)
    cl.barrier(ctx)  # peers finished reading our scratch


def two_shot_all_reduce(comm, flat: torch.Tensor, out: torch.Tensor, op: int) -> None:
    n = flat.numel()
    world = comm.world_size
    step = comm.scratch_bytes // flat.element_size() // 64 * 64
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        scratch = comm.scratch((hi - lo) * flat.element_size(), flat.dtype)
        scratch.copy_(flat[lo:hi])
        chunk = triton.cdiv(hi - lo, world)
        cfg = launch_for(comm, chunk)
        two_shot_all_reduce_kernel[(cfg.programs,)](
            scratch, out[lo:hi], comm.context, hi - lo, chunk,
            OP=op, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
