"""All-to-all: dim 0 splits in W chunks; chunk j of rank i lands as chunk i on rank j.

Direct push: each rank writes chunk c of its input into its slot of rank c's inbox and
then copies the slots it received into its output. Inboxes are double-buffered by the
call number (no trailing barrier).

When it wins (2xH200, bf16, CUDA graphs, bench/results/2xh200-w2.json):
against NCCL up to 256 MiB — 8 B 5.7 µs against 11.1, 1 MiB 8.8 against 17.5, 256 MiB
420 against 485; at 1 GiB it ties (1634 against 1631) and ``copy_engine``
(``_copy_engine``) wins (1597).

    n = call number;  inbox = scratch[n % 2]                       # [W, CAP]
    for every peer c:  inbox@c[me] = x[chunk c];      out[me] = x[chunk me]
    signal every peer (n);  wait for every peer (n)
    out[src] = inbox[src]     for every src != me
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives import _copy_engine, _sync
from commlab.collectives._common import (
    launch_for,
    peer_ptr,
    rounds_for,
    slot_elems,
    split_dim0,
)
from commlab.collectives._host import Collective, run
from commlab.collectives._launch import launch
from commlab.runtime.communicator import publishes_local_errors


@triton.jit
def all_to_all_kernel(
    # Local buffers
    x_ptr,  # [W, C] outgoing chunks as rows; this piece is columns [COL, COL+COLS)
    out_ptr,  # [W, C] incoming chunks as rows
    # Symmetric buffers
    scratch_ptr,  # [2, W, CAP] inboxes
    ctx,
    # Sizes
    COLS,
    CAP,
    C,
    COL,
    # Meta-parameters
    BLOCK: tl.constexpr,
    ROUNDS: tl.constexpr,  # pipeline depth: copy-out of slice t-1 overlaps push of t
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    me64 = me.to(tl.int64)
    n = _sync.begin_call(ctx)
    base = n * _sync.PHASES
    inbox = scratch_ptr + (n % 2).to(tl.int64) * world * CAP
    per = tl.cdiv(_sync.my_blocks(COLS, BLOCK), ROUNDS)
    for t in range(0, ROUNDS + 1):
        # --- slice t: push chunk c to rank c; keep our own chunk
        if t < ROUNDS:
            for i in range(0, world):
                c = (me + i) % world
                src = x_ptr + c.to(tl.int64) * C + COL
                if i == 0:
                    dst = out_ptr + me64 * C + COL
                else:
                    dst = peer_ptr(inbox, c, ctx) + me64 * CAP
                for j in range(t * per, (t + 1) * per):
                    offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                    mask = offs < COLS
                    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
            _sync.signal_all(ctx, base + t + 1)
        # --- slice t-1: every chunk sent to us landed; copy into its row
        if t >= 1:
            s_ = t - 1
            _sync.wait_all(ctx, base + s_ + 1)
            for i in range(1, world):
                s = (me + i) % world
                slot = inbox + s.to(tl.int64) * CAP
                row = out_ptr + s.to(tl.int64) * C + COL
                for j in range(s_ * per, (s_ + 1) * per):
                    offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                    mask = offs < COLS
                    tl.store(row + offs, tl.load(slot + offs, mask=mask), mask=mask)
    _sync.end_call(ctx, n)


@publishes_local_errors(dispatch=True)
def all_to_all(x: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
    """Exchange chunks: dim 0 in ``world_size`` chunks, chunk j goes to rank j; the result
    holds, in rank order, the chunk each rank sent here. ``algorithm``: "direct" (SM
    pushes), "copy_engine" (DMA, ``_copy_engine``) or "auto" (``_select``)."""
    return run(ALL_TO_ALL, x, algorithm)


def _all_to_all_ce(comm, x, out, record: list | None = None) -> None:
    """Copy-engine all-to-all: chunk p to rank p's inbox by DMA, the received copied out."""
    world, me = comm.world_size, comm.rank
    c = x.numel() // world
    flat, flat_out = x.view(-1), out.view(-1)
    cap = _copy_engine.capacity(comm, x.element_size())
    for lo in range(0, c, cap):
        hi = min(c, lo + cap)
        sends = {p: flat[p * c + lo: p * c + hi] for p in range(world) if p != me}
        _copy_engine.exchange(comm, sends, flat[me * c + lo: me * c + hi], flat_out[lo:],
                              hi - lo, c)


def _all_to_all(comm, x, out, record: list | None = None) -> None:
    world = comm.world_size
    c = x.numel() // world
    esz = x.element_size()
    cap = slot_elems(comm, esz, 2 * world)  # two halves of W inbox slots
    for lo in range(0, c, cap):
        hi = min(c, lo + cap)
        scratch = comm.scratch(2 * world * cap * esz, x.dtype)
        cfg = launch_for(comm, hi - lo)
        launch(all_to_all_kernel, (cfg.programs,),
               (x.view(-1), out.view(-1), scratch, comm.context, hi - lo, cap, c, lo),
               {"BLOCK": cfg.block, "ROUNDS": rounds_for(comm, hi - lo, cfg)},
               num_warps=cfg.num_warps, backend=comm.backend, record=record)


ALL_TO_ALL = Collective("all_to_all", {"direct": _all_to_all, "copy_engine": _all_to_all_ce},
                        shape_rule=split_dim0, capture_choice=True)
