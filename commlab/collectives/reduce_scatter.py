"""Reduce-scatter: dim 0 splits in W chunks; rank r gets the reduction of chunk r.

Direct pull: each rank reads its chunk from every peer's staged input and reduces it,
(W-1)/W of the input crossing the links per rank.

    stage x into my scratch
    barrier                      # inputs staged
    out = reduce over r of scratch@r[chunk me]
    barrier                      # peers finished reading our scratch
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import (
    OPS,
    agree,
    check_local,
    combine,
    comm_or_raise,
    launch_for,
    load_acc,
    peer_ptr,
    traced,
)


@triton.jit
def reduce_scatter_kernel(
    # Symmetric buffers
    scratch_ptr,  # [W, CHUNK_TOTAL] staged input piece: COLS columns of each chunk
    # Local buffers
    out_ptr,  # [CHUNK_TOTAL], this piece at COL
    ctx,
    # Sizes
    COLS,  # elements of each chunk in this piece
    COL,  # where this piece starts inside a chunk
    # Meta-parameters
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    cl.barrier(ctx)  # inputs staged
    mine = scratch_ptr + me.to(tl.int64) * COLS
    for start in range(pid * BLOCK, COLS, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < COLS
        acc = load_acc(mine + offs, mask)
        for i in range(1, world):
            src = peer_ptr(scratch_ptr, (me + i) % world, ctx) + me.to(tl.int64) * COLS
            acc = combine(acc, load_acc(src + offs, mask), OP)
        tl.store(out_ptr + COL + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    cl.barrier(ctx)  # peers finished reading our scratch


def reduce_scatter(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``x`` across ranks and return this rank's chunk of dim 0.

    ``x.shape[0]`` must be divisible by the world size; returns a new tensor of shape
    ``[x.shape[0] // world_size, *x.shape[1:]]``."""
    comm = comm_or_raise()
    err = check_local("reduce_scatter", comm, x, reduce_op=op, split_dim0=True)
    call = agree("reduce_scatter", x, err, op=op)
    x = call.x.contiguous()
    world = comm.world_size
    out = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    rows = x.view(world, -1)  # [W, C]: chunk r is row r
    c = rows.shape[1]
    with traced("reduce_scatter", x.numel() * x.element_size(), "direct", comm.device):
        step = comm.scratch_bytes // (x.element_size() * world) // 64 * 64
        flat_out = out.view(-1)
        for lo in range(0, c, step):
            hi = min(c, lo + step)
            cols = hi - lo
            scratch = comm.scratch(world * cols * x.element_size(), x.dtype).view(world, cols)
            scratch.copy_(rows[:, lo:hi])
            cfg = launch_for(comm, cols)
            reduce_scatter_kernel[(cfg.programs,)](
                scratch, flat_out, comm.context, cols, lo,
                OP=OPS[op], BLOCK=cfg.block, num_warps=cfg.num_warps,
            )
    return out
