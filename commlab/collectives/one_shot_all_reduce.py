"""One-shot all-reduce: every rank pushes its whole input to every peer, then reduces.

Wins when latency dominates (small messages, every world size) and, with two ranks, at
every size: each rank sends N bytes and receives N, the least any all-reduce can move
between two GPUs, with a single synchronisation. With W ranks it sends (W-1)·N, so
beyond two ranks two-shot takes over from mid sizes (see _select).

When it wins (2xH200, bf16, CUDA graphs, bench/results/2xh200-w2.json): the
fastest all-reduce here from 8 B to 16 MiB — 6.0-6.9 µs up to 256 KiB against NCCL's
11.2-12.9 and PyTorch symmetric memory's best 7.9-8.6; 65.8 µs at 16 MiB against
two-shot's 70.4 and NCCL's 79.2.

The input is read in place (no staging copy). Receive slots are double-buffered by the
call number, which is what lets a call return without a trailing barrier: a rank can
only write slot half h again two calls later, after the peer has synchronised with it
in the call in between.

    n = this program's call number;  recv = scratch[n % 2]        # [W, CAP] slots
    for each of my blocks b:   recv@peer[me][b] = x[b]           for every peer
    signal every peer (n);  wait for every peer (n)   # their pushes into our slots landed
    for each of my blocks b:   out[b] = reduce in rank order (x[b] standing in for recv[me])
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives import _sync
from commlab.collectives._common import combine, launch_for, load_acc, peer_ptr, slot_elems
from commlab.collectives._launch import launch


@triton.jit
def one_shot_all_reduce_kernel(
    # Local buffers
    x_ptr,  # [N] this rank's input (any device memory: read in place)
    out_ptr,  # [N]
    # Symmetric buffers
    scratch_ptr,  # [2, W, CAP] receive slots, same offset on every rank
    ctx,
    # Sizes
    N,
    CAP,  # elements per receive slot (>= N)
    # Meta-parameters
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    n = _sync.begin_call(ctx)
    recv = scratch_ptr + (n % 2).to(tl.int64) * world * CAP  # this call's half
    # --- push: our input into our slot on every peer
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        v = tl.load(x_ptr + offs, mask=mask)
        for i in range(1, world):
            dst = peer_ptr(recv, (me + i) % world, ctx) + me.to(tl.int64) * CAP
            tl.store(dst + offs, v, mask=mask)
    # --- every peer's push into our slots has landed (and ours into theirs)
    _sync.signal_all(ctx, n * _sync.PHASES + 1)
    _sync.wait_all(ctx, n * _sync.PHASES + 1)
    # --- reduce locally, in rank order 0..W-1 on every rank: float addition is not
    # associative, and every rank must end with the same bits (as with NCCL)
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        if me == 0:
            acc = load_acc(x_ptr + offs, mask)
        else:
            acc = load_acc(recv + offs, mask)  # rank 0's slot
        for r in range(1, world):
            if r == me:
                v = load_acc(x_ptr + offs, mask)
            else:
                slot = tl.full((), r, tl.int64) * CAP  # r may be a plain int (interpreter)
                v = load_acc(recv + slot + offs, mask)
            acc = combine(acc, v, OP)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    _sync.end_call(ctx, n)


def one_shot_capacity(comm, elem_size: int) -> int:
    """Largest element count one launch handles (two halves of W slots in the scratch)."""
    return slot_elems(comm, elem_size, 2 * comm.world_size)


def one_shot_all_reduce(comm, flat: torch.Tensor, out: torch.Tensor, op: int,
                        record: list | None = None):
    """Reduce ``flat`` (contiguous, 1-D) across ranks into ``out``. Returns the compiled
    kernel of the last launch on CUDA (for launch plans), else None."""
    n = flat.numel()
    compiled = None
    cap = one_shot_capacity(comm, flat.element_size())
    for lo in range(0, n, cap):
        hi = min(n, lo + cap)
        cfg = launch_for(comm, hi - lo)
        scratch = comm.scratch(2 * comm.world_size * cap * flat.element_size(), flat.dtype)
        compiled = launch(one_shot_all_reduce_kernel, (cfg.programs,),
                          (flat[lo:hi], out[lo:hi], scratch, comm.context, hi - lo, cap),
                          {"OP": op, "BLOCK": cfg.block}, num_warps=cfg.num_warps,
                          backend=comm.backend, record=record)
    return compiled
