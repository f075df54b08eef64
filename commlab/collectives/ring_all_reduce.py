"""Ring all-reduce: W-1 reduce-scatter steps then W-1 all-gather steps around a ring.

Each step a rank reads one chunk from its left neighbour only, so every link carries
the same N/W per step: the classic bandwidth-optimal schedule (NCCL's for large
messages), at the price of 2·(W-1) barriers. Here mostly for teaching and for worlds
where not every pair of ranks is directly linked.

When it wins (2xH200, bf16, CUDA graphs, bench/results/2xh200-w2.json): never
with two ranks (8 B 12.5 µs against one-shot's 6.2; 1 GiB 4021 against two-shot's 3179);
its place is rings of many ranks whose pairs are not all linked.

    stage x into my scratch;  left = me - 1
    for s in 0..W-2:   c = me - s - 1;  scratch[c] += scratch@left[c];  barrier
    # now scratch[me + 1] holds the full reduction of chunk me + 1
    for s in 0..W-2:   c = me - s;      scratch[c]  = scratch@left[c];  barrier
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import combine, launch_for, load_acc, peer_ptr, slot_elems
from commlab.runtime import records


@triton.jit
def ring_all_reduce_kernel(
    # Symmetric buffers
    scratch_ptr,  # [N] staged input, reduced in place chunk by chunk
    # Local buffers
    out_ptr,  # [N]
    ctx,
    # Sizes
    N,
    CHUNK,
    # Meta-parameters
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    left = peer_ptr(scratch_ptr, (me + world - 1) % world, ctx)
    cl.record_begin(ctx)
    cl.barrier(ctx)  # inputs staged
    cl.record_arrived(ctx)
    # --- reduce-scatter around the ring
    for s in range(0, world - 1):
        c = (me + 2 * world - s - 1) % world
        for start in range(pid * BLOCK, CHUNK, nprog * BLOCK):
            offs = c * CHUNK + start + tl.arange(0, BLOCK)
            mask = (offs < N) & (offs < (c + 1) * CHUNK)
            acc = combine(load_acc(scratch_ptr + offs, mask), load_acc(left + offs, mask), OP)
            res = acc.to(out_ptr.dtype.element_ty)
            tl.store(scratch_ptr + offs, res, mask=mask)
            if s == world - 2:  # chunk c == me + 1 is final here
                tl.store(out_ptr + offs, res, mask=mask)
        cl.barrier(ctx)  # step s written everywhere: the right neighbour may read it
    if world == 1:
        for start in range(pid * BLOCK, N, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(scratch_ptr + offs, mask=offs < N), mask=offs < N)
    # --- all-gather around the ring
    for s in range(0, world - 1):
        c = (me + world - s) % world  # left finished chunk c in its previous step
        for start in range(pid * BLOCK, CHUNK, nprog * BLOCK):
            offs = c * CHUNK + start + tl.arange(0, BLOCK)
            mask = (offs < N) & (offs < (c + 1) * CHUNK)
            v = tl.load(left + offs, mask=mask)
            tl.store(scratch_ptr + offs, v, mask=mask)
            tl.store(out_ptr + offs, v, mask=mask)
        cl.barrier(ctx)  # step s written: the right neighbour may read it; also frees scratch
    cl.record_end(ctx)


def ring_all_reduce(comm, flat: torch.Tensor, out: torch.Tensor, op: int,
                    record: list | None = None) -> None:
    """``record`` is ignored: the ring launches through Triton's ordinary path (its
    cl.barrier rounds dominate its latency anyway), so it never gets a launch plan."""
    n = flat.numel()
    world = comm.world_size
    step = slot_elems(comm, flat.element_size(), 1)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        scratch = comm.scratch((hi - lo) * flat.element_size(), flat.dtype)
        scratch.copy_(flat[lo:hi])
        chunk = triton.cdiv(hi - lo, world)
        cfg = launch_for(comm, chunk)
        ring_all_reduce_kernel[(cfg.programs,)](
            scratch, out[lo:hi], comm.context, hi - lo, chunk,
            OP=op, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
        records.launched()
