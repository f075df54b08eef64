"""Two-shot all-reduce: a push reduce-scatter, then a push all-gather, pipelined.

Rank c owns chunk c of the N elements. Each rank sends (W-1)/W·N per phase, 2·(W-1)/W·N
in all, against one-shot's (W-1)·N: the bandwidth algorithm (with two ranks both send
N, and two-shot's pipeline wins from a few MiB up: see _select).

When it wins (2xH200, bf16, CUDA graphs, bench/results/2xh200-w2.json): from
64 MiB up — 224.7 µs against one-shot's 244.4 and NCCL's 251.5; 1 GiB in 3179 µs (337
GB/s busbw) against NCCL's 3266. PyTorch's two-shot is 3-5% faster from 64 MiB to 256
MiB and 3% slower at 1 GiB.

Each program's share of a chunk is cut into ROUNDS slices and the three steps run as a
software pipeline, so NVLink traffic (steps 1 and 2) overlaps the local copy (step 3):

    # scratch: A = [W, CH] reduce-scatter inbox, B = [W, CH] all-gather inbox
    for t in 0 .. ROUNDS + 1:
        1. slice t:     A@c[me] = x[chunk c]  for every peer c;      signal bank 0 (t)
        2. slice t - 1: wait bank 0 (t - 1);  res = x[chunk me] (op) A[src] over src
                        out[chunk me] = res;  B@c[me] = res  for every peer c;
                        signal bank 1 (t - 1)
        3. slice t - 2: wait bank 1 (t - 2);  out[chunk src] = B[src]  for src != me

No trailing barrier: a peer overwrites our A in its next call only after our bank-1
signal for the last slice (sent after we read A), and our B only after our next call's
first bank-0 signal (sent after this kernel, i.e. after we copied B out).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives import _sync
from commlab.collectives._common import (
    combine,
    launch_for,
    load_acc,
    peer_ptr,
    rounds_for,
    slot_elems,
)
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
    ROUNDS: tl.constexpr,  # pipeline depth (1: plain three-step kernel)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    me64 = me.to(tl.int64)
    inbox_a = scratch_ptr
    inbox_b = scratch_ptr + world.to(tl.int64) * CH
    mine = me64 * CH
    n = _sync.begin_call(ctx)
    base = n * _sync.PHASES
    per = tl.cdiv(_sync.my_blocks(CH, BLOCK), ROUNDS)  # blocks per slice
    for t in range(0, ROUNDS + 2):
        # --- step 1, slice t: push each peer's chunk of our input into its inbox A
        if t < ROUNDS:
            for i in range(1, world):
                c = (me + i) % world
                dst = peer_ptr(inbox_a, c, ctx) + me64 * CH
                src = x_ptr + c.to(tl.int64) * CH
                for j in range(t * per, (t + 1) * per):
                    offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                    mask = (offs < CH) & (c.to(tl.int64) * CH + offs < N)
                    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
            _sync.signal_all(ctx, base + t + 1, 0)
        # --- step 2, slice t-1: reduce our chunk, keep it, push it to every inbox B
        if t >= 1 and t <= ROUNDS:
            s = t - 1
            _sync.wait_all(ctx, base + s + 1, 0)  # the peers' shares of slice s landed
            for j in range(s * per, (s + 1) * per):
                offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                mask = (offs < CH) & (mine + offs < N)
                acc = load_acc(x_ptr + mine + offs, mask)
                for i in range(1, world):
                    r = (me + i) % world
                    acc = combine(acc, load_acc(inbox_a + r.to(tl.int64) * CH + offs, mask), OP)
                res = acc.to(out_ptr.dtype.element_ty)
                tl.store(out_ptr + mine + offs, res, mask=mask)
                for i in range(1, world):
                    dst = peer_ptr(inbox_b, (me + i) % world, ctx) + me64 * CH
                    tl.store(dst + offs, res, mask=mask)
            _sync.signal_all(ctx, base + s + 1, 1)
        # --- step 3, slice t-2: copy the other owners' results out of inbox B
        if t >= 2:
            s = t - 2
            _sync.wait_all(ctx, base + s + 1, 1)  # every owner's slice s landed
            for i in range(1, world):
                r = (me + i) % world
                off = r.to(tl.int64) * CH
                for j in range(s * per, (s + 1) * per):
                    offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                    mask = (offs < CH) & (off + offs < N)
                    tl.store(out_ptr + off + offs, tl.load(inbox_b + off + offs, mask=mask), mask=mask)
    _sync.end_call(ctx, n)


def two_shot_capacity(comm, elem_size: int) -> int:
    """Largest element count one launch handles (inboxes A and B of W chunks each)."""
    w = comm.world_size
    return slot_elems(comm, elem_size, 2 * w) * w


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
        rounds = rounds_for(comm, ch, cfg)
        launch(two_shot_all_reduce_kernel, (cfg.programs,),
               (flat[lo:hi], out[lo:hi], scratch, comm.context, hi - lo, ch),
               {"OP": op, "BLOCK": cfg.block, "ROUNDS": rounds}, num_warps=cfg.num_warps,
               backend=comm.backend, record=record)
