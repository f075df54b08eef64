"""Two-shot all-reduce: a push reduce-scatter, then a push all-gather.

Rank c owns chunk c of the N elements. Each rank sends (W-1)/W·N per phase, 2·(W-1)/W·N
in all, against one-shot's (W-1)·N: the bandwidth algorithm beyond two ranks. (With two
ranks both send N; one-shot needs one synchronisation less.)

    # scratch: A = [W, CH] reduce-scatter inbox, B = [W, CH] all-gather inbox
    for every peer c:  A@c[me] = x[chunk c]                      # push their chunk
    signal/wait phase 1                   # every peer's share of our chunk has landed
    res = x[chunk me] (op) A[src] over src;  out[chunk me] = res
    for every peer c:  B@c[me] = res                             # push our result
    signal/wait phase 2                   # every owner's result has landed
    out[chunk src] = B[src]               for every src != me

No trailing barrier: a peer overwrites A in the next call only after our phase-2
signal (sent after we finished reading A), and B only after our next phase-1 signal
(sent after we finished copying B out).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives import _sync
from commlab.collectives._common import combine, launch_for, load_acc, peer_ptr
from commlab.collectives._launch import launch


@triton.jit
def two_shot_all_reduce_kernel(
    # Local buffers
    x_ptr,  # [N] input, read in place
    out_ptr,  # [N]
    # Symmetric buffers
    scratch_ptr,  # [2, W, CH]: inbox A then inbox B
    ctx,
    # Sizes
    N,
    CH,  # elements per chunk: ceil(N / W) rounded up to a multiple of 64
    # Meta-parameters
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    me64 = me.to(tl.int64)
    inbox_a = scratch_ptr
    inbox_b = scratch_ptr + world.to(tl.int64) * CH
    n = _sync.begin_call(ctx)
    # --- phase 1: push each peer's chunk of our input into its inbox A
    for i in range(1, world):
        c = (me + i) % world
        dst = peer_ptr(inbox_a, c, ctx) + me64 * CH
        src = x_ptr + c.to(tl.int64) * CH
        for start in range(pid * BLOCK, CH, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = (offs < CH) & (c.to(tl.int64) * CH + offs < N)
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
    _sync.signal_all(ctx, n * _sync.PHASES + 1)
    _sync.wait_all(ctx, n * _sync.PHASES + 1)  # our chunk's shares have landed
    # --- reduce our chunk; keep it and push it to every peer's inbox B
    mine = me64 * CH
    for start in range(pid * BLOCK, CH, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = (offs < CH) & (mine + offs < N)
        acc = load_acc(x_ptr + mine + offs, mask)
        for i in range(1, world):
            s = (me + i) % world
            acc = combine(acc, load_acc(inbox_a + s.to(tl.int64) * CH + offs, mask), OP)
        res = acc.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + mine + offs, res, mask=mask)
        for i in range(1, world):
            dst = peer_ptr(inbox_b, (me + i) % world, ctx) + me64 * CH
            tl.store(dst + offs, res, mask=mask)
    _sync.signal_all(ctx, n * _sync.PHASES + 2)
    _sync.wait_all(ctx, n * _sync.PHASES + 2)  # every owner's result has landed
    # --- all-gather: copy the other owners' results out of inbox B
    for i in range(1, world):
        s = (me + i) % world
        base = s.to(tl.int64) * CH
        for start in range(pid * BLOCK, CH, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = (offs < CH) & (base + offs < N)
            tl.store(out_ptr + base + offs, tl.load(inbox_b + base + offs, mask=mask), mask=mask)
    _sync.end_call(ctx, n)


def two_shot_capacity(comm, elem_size: int) -> int:
    """Largest element count one launch handles (inboxes A and B of W chunks each)."""
    w = comm.world_size
    return comm.scratch_bytes // (2 * elem_size * w) // 64 * 64 * w


def two_shot_all_reduce(comm, flat: torch.Tensor, out: torch.Tensor, op: int,
                        record: list | None = None) -> None:
    n = flat.numel()
    world = comm.world_size
    cap = two_shot_capacity(comm, flat.element_size())
    for lo in range(0, n, cap):
        hi = min(n, lo + cap)
        # chunks start on 64-element boundaries: Triton then knows every chunk base is
        # 16-byte aligned and keeps vector loads and stores
        ch = triton.cdiv(triton.cdiv(hi - lo, world), 64) * 64
        scratch = comm.scratch(2 * world * ch * flat.element_size(), flat.dtype)
        cfg = launch_for(comm, ch)
        launch(two_shot_all_reduce_kernel, (cfg.programs,),
               (flat[lo:hi], out[lo:hi], scratch, comm.context, hi - lo, ch),
               {"OP": op, "BLOCK": cfg.block}, num_warps=cfg.num_warps, backend=comm.backend,
               record=record)
