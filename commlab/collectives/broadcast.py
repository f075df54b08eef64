"""Broadcast: every rank ends with ``src``'s tensor.

Direct push from the source: it writes its input into every rank's inbox and signals;
the others copy their inbox out, slice by slice behind the source. The source's
outgoing links carry (W-1)·N: about N / link bandwidth with two ranks.

Inboxes are double-buffered by call parity and every rank acknowledges every call to
every other (the source changes from call to call). Before writing, the source waits
for the acknowledgements of call n-2, the last user of this half: in steady state they
arrived long ago, so no round trip sits on the critical path. The acknowledgement
needs no release fence (``_sync.ack_all``): it only says our reads are done.

When it wins (2xH200, bf16, CUDA graphs, bench/results/2xh200-w2.json):
against NCCL up to 16 MiB — 8 B 5.6 µs against 7.1, 1 MiB 11.5 against 16.0, 16 MiB 57.8
against 61.7. From 256 MiB NCCL is 2-4% faster (747 against 773 µs; 1 GiB 2918 against
3073, ``copy_engine`` 2971): a kernel pushing in one direction tops out at 355 GB/s here
(bench/results/link-ceiling-2xh200.txt), NCCL's broadcast reaches 368.

    n = call number;  inbox = scratch[n % 2]
    src:    wait acks (n - 2) from every rank
            for t in 0 .. ROUNDS-1:  inbox@peer[slice t] = x[slice t];  out = x;  signal (t)
    others: for t in 0 .. ROUNDS-1:  wait for src (t);  out[slice t] = inbox[slice t]
    every rank: acknowledge call n to every other
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
)
from commlab.collectives._host import Collective, run
from commlab.collectives._launch import launch
from commlab.runtime.communicator import publishes_local_errors


@triton.jit
def broadcast_kernel(
    # Local buffers
    x_ptr,  # [N] input (read on src only)
    out_ptr,  # [N]
    # Symmetric buffers
    scratch_ptr,  # [2, CAP] inboxes
    ctx,
    # Sizes
    N,
    CAP,
    SRC,
    # Meta-parameters
    BLOCK: tl.constexpr,
    ROUNDS: tl.constexpr,  # pipeline depth: receivers copy slice t while src pushes t+1
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    n = _sync.begin_call(ctx)
    base = n * _sync.PHASES
    inbox = scratch_ptr + (n % 2).to(tl.int64) * CAP
    per = tl.cdiv(_sync.my_blocks(N, BLOCK), ROUNDS)
    if me == SRC:
        _sync.wait_all(ctx, base - 2 * _sync.PHASES + 1, 0)  # call n-2 done: half is free
        for t in range(0, ROUNDS):
            for j in range(t * per, (t + 1) * per):
                offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                mask = offs < N
                v = tl.load(x_ptr + offs, mask=mask)
                tl.store(out_ptr + offs, v, mask=mask)
                for i in range(1, world):
                    tl.store(peer_ptr(inbox, (me + i) % world, ctx) + offs, v, mask=mask)
            _sync.signal_all(ctx, base + t + 1, 1)  # slice t is in every inbox
    else:
        for t in range(0, ROUNDS):
            _sync.wait_from(ctx, SRC, base + t + 1, 1)
            for j in range(t * per, (t + 1) * per):
                offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                mask = offs < N
                tl.store(out_ptr + offs, tl.load(inbox + offs, mask=mask), mask=mask)
    _sync.ack_all(ctx, base + 1, 0)  # acknowledge: we are done with call n's inboxes
    _sync.end_call(ctx, n)


@publishes_local_errors(dispatch=True)
def broadcast(x: torch.Tensor, src: int = 0, algorithm: str = "auto") -> torch.Tensor:
    """Return a copy of rank ``src``'s ``x`` on every rank (``x`` gives shape and dtype
    elsewhere and must match src's). ``algorithm``: "direct" (SM pushes), "copy_engine"
    (DMA, ``_copy_engine``) or "auto" (``_select``)."""
    return run(BROADCAST, x, algorithm, src)


def _broadcast_ce(comm, x, out, src: int, record: list | None = None) -> None:
    """Copy-engine broadcast: src's input to every inbox by DMA, copied out behind it."""
    flat, flat_out, n = x.view(-1), out.view(-1), x.numel()
    me = comm.rank
    cap = _copy_engine.capacity(comm, x.element_size())
    for lo in range(0, n, cap):
        hi = min(n, lo + cap)
        piece = flat[lo:hi]
        sends = {p: piece for p in range(comm.world_size) if p != me} if me == src else {}
        _copy_engine.exchange(comm, sends, piece if me == src else None, flat_out[lo:],
                              hi - lo, 0, src)


def _broadcast(comm, x, out, src: int, record: list | None = None) -> None:
    flat, n = x.view(-1), x.numel()
    flat_out = out.view(-1)
    esz = x.element_size()
    cap = slot_elems(comm, esz, 2)  # two inbox halves
    for lo in range(0, n, cap):
        hi = min(n, lo + cap)
        scratch = comm.scratch(2 * cap * esz, x.dtype)
        cfg = launch_for(comm, hi - lo)
        launch(broadcast_kernel, (cfg.programs,),
               (flat[lo:hi], flat_out[lo:hi], scratch, comm.context, hi - lo, cap, src),
               {"BLOCK": cfg.block, "ROUNDS": rounds_for(comm, hi - lo, cfg)},
               num_warps=cfg.num_warps, backend=comm.backend, record=record)


BROADCAST = Collective("broadcast", {"direct": _broadcast, "copy_engine": _broadcast_ce},
                       params=("src",), capture_choice=True)
