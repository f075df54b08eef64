"""All-to-all: dim 0 splits in W chunks; chunk j of rank i lands as chunk i on rank j.

Direct pull: rank j copies chunk j of every peer's staged input into its own output.

    stage x into my scratch
    barrier                      # inputs staged
    out[r] = scratch@r[chunk me]   for every r
    barrier                      # peers finished reading our scratch
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import (
    agree,
    check_local,
    comm_or_raise,
    launch_for,
    peer_ptr,
    traced,
)


@triton.jit
def all_to_all_kernel(
    # Symmetric buffers
    scratch_ptr,  # [W, COLS] staged piece of each outgoing chunk
    # Local buffers
    out_ptr,  # [W, C] rows are incoming chunks; this piece at column COL
    ctx,
    # Sizes
    COLS,
    C,
    COL,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    cl.barrier(ctx)  # inputs staged
    for i in range(0, world):
        r = (me + i) % world
        src = peer_ptr(scratch_ptr, r, ctx) + me.to(tl.int64) * COLS
        dst = out_ptr + r.to(tl.int64) * C + COL
        for start in range(pid * BLOCK, COLS, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < COLS
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
    cl.barrier(ctx)  # peers finished reading our scratch


def all_to_all(x: torch.Tensor) -> torch.Tensor:
    """Exchange chunks: dim 0 in ``world_size`` chunks, chunk j goes to rank j; the result
    holds, in rank order, the chunk each rank sent here."""
    comm = comm_or_raise()
    err = check_local("all_to_all", comm, x, split_dim0=True)
    call = agree("all_to_all", x, err)
    x = call.x.contiguous()
    world = comm.world_size
    out = torch.empty_like(x)
    rows = x.view(world, -1)
    c = rows.shape[1]
    with traced("all_to_all", x.numel() * x.element_size(), "direct", comm.device):
        step = comm.scratch_bytes // (x.element_size() * world) // 64 * 64
        for lo in range(0, c, step):
            hi = min(c, lo + step)
            cols = hi - lo
            scratch = comm.scratch(world * cols * x.element_size(), x.dtype).view(world, cols)
            scratch.copy_(rows[:, lo:hi])
            cfg = launch_for(comm, cols)
            all_to_all_kernel[(cfg.programs,)](
                scratch, out.view(world, c), comm.context, cols, c, lo,
                BLOCK=cfg.block, num_warps=cfg.num_warps,
            )
    return out
