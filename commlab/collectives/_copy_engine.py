"""Copy-engine exchange: the bytes cross NVLink by DMA, the synchronisation stays on the
device, and a Triton kernel copies what landed into the output while later chunks are
still in flight. Used by the ``copy_engine`` algorithm of all_gather, all_to_all and
broadcast.

Why: on 2xH200 a copy engine moves 389-394 GB/s per direction, SM stores at most 355
whatever the launch shape (bench/probes/gpu_link_ceiling.py, bench/results/
link-ceiling-2xh200.txt), so for big messages the copy engines are the faster mover;
the SMs are then free for the copy-out (local HBM, ~10x faster than the link).

Protocol of one exchange e (``state[0]``, a device-side counter, so replays of a CUDA
graph get fresh numbers; every rank runs the same exchanges in the same order):

    main stream:  begin       state[0] += 1                              (Triton, 1 program)
                  barrier     every rank finished the work queued before  (Triton, 1 program)
                              this exchange: its inbox is no longer read
    side stream:  per chunk c, per peer p:
                              inbox@p[me][c] = send[p][c]                (copy engine)
                              flag@p[me][c] = state[0]                   (copy engine, 4 B,
                                                                          queued after the chunk)
    main stream:  copy out    out[me] = own;  for c, for src: wait flag[src][c] >= e,
                              out[src][c] = inbox[src][c]                (Triton)
                  barrier     every rank has copied out: the next call's pushes (copy
                              engine or SM, which share the scratch) may land (its own
                              signal-pad row)
                  join the side stream

The inbox is the start of the scratch, which the SM algorithms also use: the two
barriers (a few µs each) make mixing algorithms from call to call safe. Nothing an SM
runs ever waits for a kernel queued behind a spinning one: the copy-out only waits for
copy-engine writes, and the barriers sit on the main stream before and after it. On the
CPU backend the same steps run in order on the host (torch copies into the peers' shared
memory; x86 stores are seen in order, so a flag is never seen before its chunk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives._common import launch_for, slot_elems
from commlab.collectives._launch import launch
from commlab.collectives.barrier import barrier_kernel
from commlab.runtime.heap import CE_FLAGS_INTS, CE_FLAGS_OFFSET, MAX_CE_CHUNKS
from commlab.runtime.peer import peer_view

MAX_CHUNKS = MAX_CE_CHUNKS  # flags per (source, exchange)
CHUNK_BYTES = 16 << 20  # at least this much per copy-engine copy (its launch costs ~µs)


@triton.jit
def ce_begin_kernel(state_ptr):
    tl.store(state_ptr, tl.load(state_ptr) + 1)


@triton.jit
def ce_end_barrier_kernel(ctx):
    # Launched with 2 programs: program 1 meets on signal-pad row 1, apart from the
    # opening barrier's row 0 (both are on the main stream; separate rows keep them
    # independent should the opening one ever move to another stream).
    if tl.program_id(0) == 1:
        cl.barrier(ctx)


@triton.jit
def ce_copy_out_kernel(
    # Local buffers
    own_ptr,  # [N] what lands in our own row (unused when SRC >= 0 and SRC != me)
    out_ptr,  # rows of N at stride OUT_STRIDE (0: every source writes the same row)
    # Symmetric buffers
    inbox_ptr,  # [W, CAP]: row src is written by rank src's copy engine
    state_ptr,  # int32 [1 + MAX_WORLD * MAX_CHUNKS]: exchange counter, then flags
    ctx,
    # Sizes
    N,
    CAP,
    OUT_STRIDE,
    CHUNK,
    NCHUNK,
    SRC,  # -1: every peer sends to us; else only rank SRC sends (broadcast)
    # Meta-parameters
    FLAGS: tl.constexpr,
    MAXC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    e = tl.load(state_ptr)
    if (SRC < 0) | (me == SRC):  # our own row: nothing to wait for
        dst = out_ptr + me.to(tl.int64) * OUT_STRIDE
        for start in range(pid * BLOCK, N, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < N
            tl.store(dst + offs, tl.load(own_ptr + offs, mask=mask), mask=mask)
    for c in range(0, NCHUNK):  # chunk by chunk, in the order the copy engines send them
        lo = c * CHUNK
        hi = tl.minimum(N, lo + CHUNK)
        for i in range(1, world):
            src = (me + i) % world
            if (SRC < 0) | (src == SRC):
                cl.wait(state_ptr + FLAGS + src * MAXC + c, e, ctx)
                slot = inbox_ptr + src.to(tl.int64) * CAP
                dst = out_ptr + src.to(tl.int64) * OUT_STRIDE
                for start in range(lo + pid * BLOCK, hi, nprog * BLOCK):
                    offs = start + tl.arange(0, BLOCK)
                    mask = offs < hi
                    tl.store(dst + offs, tl.load(slot + offs, mask=mask), mask=mask)


@dataclass
class _State:
    comm: object
    t: torch.Tensor  # int32 [1 + MAX_WORLD * MAX_CHUNKS] in the flag area: counter, flags
    side: torch.cuda.Stream | None  # None off CUDA
    views: dict = field(default_factory=dict)  # (peer, addr, numel, dtype) -> peer view

    def peer(self, t: torch.Tensor, p: int) -> torch.Tensor:
        key = (p, t.data_ptr(), t.numel(), t.dtype)
        v = self.views.get(key)
        if v is None:
            if len(self.views) > 256:
                self.views.clear()
            v = self.views[key] = peer_view(self.comm, t, p).view(-1)
        return v


_STATES: dict[int, _State] = {}


def _state(comm) -> _State:
    """This communicator's exchange counter and flags: a fixed part of the heap's flag
    area (zeroed at init and by ``comm.recover()``), so a first exchange inside a
    CUDA-graph capture allocates nothing and zeroes nothing."""
    st = _STATES.get(id(comm))
    if st is None or st.comm is not comm:
        lay = comm.heap.layout
        t = comm.heap.region(lay.flags + CE_FLAGS_OFFSET, 4 * CE_FLAGS_INTS, torch.int32)
        side = torch.cuda.Stream(comm.device) if comm.backend == "cuda" else None
        st = _STATES[id(comm)] = _State(comm, t, side)
    return st


def capacity(comm, elem_size: int) -> int:
    """Most elements one source can send in one exchange (one inbox row each)."""
    return slot_elems(comm, elem_size, comm.world_size)


def exchange(comm, sends: dict, own: torch.Tensor | None, out: torch.Tensor, n: int,
             out_stride: int, src: int = -1) -> None:
    """Move ``n`` elements from this rank to each peer in ``sends`` ({peer: flat tensor}),
    landing in row ``me`` of the peer's output; receive each peer's (or only ``src``'s)
    into our rows ``out[r * out_stride : + n]``; copy ``own`` into our own row.
    Collective: every rank calls it with the same n, out_stride and src."""
    st = _state(comm)
    world, me = comm.world_size, comm.rank
    dtype = out.dtype
    esz = out.element_size()
    cap = capacity(comm, esz)
    assert 0 < n <= cap, (n, cap)
    inbox = comm.scratch(world * cap * esz, dtype)  # [W, cap]
    chunk = max(64, math.ceil(n / max(1, min(MAX_CHUNKS, n * esz // CHUNK_BYTES))))
    chunk = (chunk + 63) // 64 * 64  # 16-byte aligned chunk starts
    nchunk = math.ceil(n / chunk)
    flags = 1
    cfg = launch_for(comm, n)
    own_arg = own if own is not None else out

    def copy_out() -> None:
        launch(ce_copy_out_kernel, (cfg.programs,),
               (own_arg, out, inbox, st.t, comm.context, n, cap, out_stride, chunk, nchunk,
                src), {"FLAGS": flags, "MAXC": MAX_CHUNKS, "BLOCK": cfg.block},
               num_warps=cfg.num_warps, backend=comm.backend)

    def push() -> None:  # chunk-major, so every receiver's first chunk leaves early
        for c in range(nchunk):
            lo, hi = c * chunk, min(n, (c + 1) * chunk)
            f = flags + me * MAX_CHUNKS + c
            for p, buf in sends.items():
                st.peer(inbox, p)[me * cap + lo: me * cap + hi].copy_(buf[lo:hi],
                                                                     non_blocking=True)
                st.peer(st.t, p)[f:f + 1].copy_(st.t[0:1], non_blocking=True)

    if comm.backend == "cuda":
        main = torch.cuda.current_stream(comm.device)
        side = st.side
        assert side is not None  # _state() made one for a CUDA communicator
        launch(ce_begin_kernel, (1,), (st.t,), {}, num_warps=1)
        # The barrier runs on the main stream, before the copy-out: a copy-out spinning on
        # every SM must never keep a kernel that the peers wait for from being scheduled
        # (with the barrier on the side stream, a CUDA-graph replay at 16 MiB deadlocked).
        launch(barrier_kernel, (1,), (comm.context,), {}, num_warps=1)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            push()
        copy_out()
        launch(ce_end_barrier_kernel, (2,), (comm.context,), {}, num_warps=1)
        main.wait_stream(side)
    else:
        st.t[0] += 1
        barrier_kernel[(1,)](comm.context)
        push()
        copy_out()
        ce_end_barrier_kernel[(2,)](comm.context)
