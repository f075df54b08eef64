"""Broadcast: every rank ends with ``src``'s tensor.

Direct pull from the source: after one barrier every rank copies src's staged input;
the source's link is the bottleneck, so the time is about N / (per-link bandwidth).

    src stages x into its scratch
    barrier                      # src's input is staged
    out = scratch@src
    barrier                      # everyone finished reading src's scratch
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
def broadcast_kernel(
    # Symmetric buffers
    scratch_ptr,  # [N] staged input (meaningful on src only)
    # Local buffers
    out_ptr,  # [N]
    ctx,
    # Sizes
    N,
    SRC,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cl.barrier(ctx)  # src's input is staged
    src = peer_ptr(scratch_ptr, SRC, ctx)
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        tl.store(out_ptr + offs, tl.load(src + offs, mask=mask), mask=mask)
    cl.barrier(ctx)  # everyone finished reading src's scratch


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Return a copy of rank ``src``'s ``x`` on every rank (``x`` gives shape and dtype
    elsewhere and must match src's)."""
    comm = comm_or_raise()
    err = check_local("broadcast", comm, x, src=src)
    call = agree("broadcast", x, err, src=src)
    x = call.x.contiguous()
    out = torch.empty_like(x)
    flat, n = x.view(-1), x.numel()
    flat_out = out.view(-1)
    with traced("broadcast", n * x.element_size(), "direct", comm.device):
        step = comm.scratch_bytes // x.element_size() // 64 * 64
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            scratch = comm.scratch((hi - lo) * x.element_size(), x.dtype)
            if comm.rank == src:
                scratch.copy_(flat[lo:hi])
            cfg = launch_for(comm, hi - lo)
            broadcast_kernel[(cfg.programs,)](
                scratch, flat_out[lo:hi], comm.context, hi - lo, src,
                BLOCK=cfg.block, num_warps=cfg.num_warps,
            )
    return out
