"""All-gather: every rank ends with every rank's input, concatenated along dim 0.

Direct (one-shot) pull: each rank copies each peer's staged input straight into its
output, peers visited in a rotated order so no rank is read by everyone at once.

    stage x into my scratch
    barrier                      # inputs staged
    out[r] = scratch@r           for every r
    barrier                      # peers finished reading our scratch
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import Call, agree, check_local, launch_for, peer_ptr, traced


@triton.jit
def all_gather_kernel(
    # Symmetric buffers
    scratch_ptr,  # [N] this rank's staged input
    # Local buffers
    out_ptr,  # [W * N_TOTAL] with this call's piece at column offset COL
    ctx,
    # Sizes
    N,  # elements in this piece
    N_TOTAL,  # elements of the whole input (row stride of the output)
    COL,  # where this piece starts inside each rank's row
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    cl.barrier(ctx)  # inputs staged: peers may read ours
    for i in range(0, world):
        r = (me + i) % world
        src = peer_ptr(scratch_ptr, r, ctx)
        dst = out_ptr + r.to(tl.int64) * N_TOTAL + COL
        for start in range(pid * BLOCK, N, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < N
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
    cl.barrier(ctx)  # peers finished reading our scratch


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` from every rank, concatenated along dim 0 (rank order).

    ``x`` must have the same shape and dtype on every rank; returns a new tensor of shape
    ``[world_size * x.shape[0], *x.shape[1:]]``."""
    from commlab.collectives._common import comm_or_raise

    comm = comm_or_raise()
    err = check_local("all_gather", comm, x, split_dim0=False)
    if not err and x.dim() == 0:
        err = "needs a tensor with at least one dimension, got a 0-d tensor; pass x.reshape(1)"
    call: Call = agree("all_gather", x, err)
    x = call.x.contiguous()
    world = comm.world_size
    out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    flat, n = x.view(-1), x.numel()
    with traced("all_gather", n * x.element_size() * world, "direct", comm.device):
        step = comm.scratch_bytes // x.element_size() // 64 * 64
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            scratch = comm.scratch((hi - lo) * x.element_size(), x.dtype)
            scratch.copy_(flat[lo:hi])
            cfg = launch_for(comm, hi - lo)
            all_gather_kernel[(cfg.programs,)](
                scratch, out, comm.context, hi - lo, n, lo,
                BLOCK=cfg.block, num_warps=cfg.num_warps,
            )
    return out
