"""One-shot all-reduce: every rank reads every peer's whole input and reduces locally.

Wins when latency dominates (small messages): one barrier round trip and one pass,
at the price of each rank reading (W-1)·N elements over the links.

    stage x into my scratch
    barrier                      # every rank's input is staged: peers may read ours
    out = reduce over r of scratch@r
    barrier                      # every peer has finished reading our scratch
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import combine, launch_for, load_acc, peer_ptr


@triton.jit
def one_shot_all_reduce_kernel(
    # Symmetric buffers
    scratch_ptr,  # [N] this rank's staged input (same offset on every rank)
    # Local buffers
    out_ptr,  # [N]
    ctx,
    # Sizes
    N,
    # Meta-parameters
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    # --- every rank's input is staged: peers may now read ours
    cl.barrier(ctx)
    # --- reduce: start with our own values, then each peer's, rotating the start so the
    # ranks do not all read from rank 0 at once
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        acc = load_acc(scratch_ptr + offs, mask)
        for i in range(1, world):
            src = peer_ptr(scratch_ptr, (me + i) % world, ctx)
            acc = combine(acc, load_acc(src + offs, mask), OP)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    # --- every peer has read our scratch: the next collective may overwrite it
    cl.barrier(ctx)


def one_shot_all_reduce(comm, flat: torch.Tensor, out: torch.Tensor, op: int) -> None:
    """Reduce ``flat`` (contiguous, 1-D) across ranks into ``out``, chunked to the scratch."""
    n = flat.numel()
    step = comm.scratch_bytes // flat.element_size() // 64 * 64
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        scratch = comm.scratch((hi - lo) * flat.element_size(), flat.dtype)
        scratch.copy_(flat[lo:hi])
        cfg = launch_for(comm, hi - lo)
        one_shot_all_reduce_kernel[(cfg.programs,)](
            scratch, out[lo:hi], comm.context, hi - lo,
            OP=op, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
