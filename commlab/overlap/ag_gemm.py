"""All-gather + GEMM, overlapped: ``all_gather(a) @ b`` without waiting for the gather.

Each rank holds a row shard ``a`` [M/W, K] and a weight ``b`` [K, N]. The output's row
chunk r needs only rank r's shard, so the GEMM starts on its own chunk at once and
takes the other chunks as they land:

    producer (push, per call e):  for peer p: gathered@p[e % 2][me] = a
                                             flags@p[me] = e          # chunk me ready on p
    consumer (GEMM tiles, chunk order me, me+1, ...):
        src = (me + chunk) % W
        if src != me: wait(flags[src] >= e)                           # chunk src landed
        out[src rows, tile] = (a if src == me else gathered[e % 2][src]) @ b

Who produces: on GPU the copy engines (``copy_`` to the peer's memory on a side stream,
then ``cuStreamWriteValue32`` of the epoch to the peer's flag), so no SM is taken from
the GEMM and no GEMM tile spinning on a flag can starve the producer. On CPU a small
producer kernel, launched before the GEMM: Triton's interpreter runs a launch's
programs one after another, so a producer inside the GEMM's launch would deadlock.

Why no barrier: the gathered buffer is double-buffered by call parity. A push into
slot e % 2 on peer p is queued after our GEMM of call e-1, which waited for p's chunk
of call e-1, which p pushed after its GEMM of call e-2 — the last reader of that slot.

When it wins (2xH200, bf16, Llama-3 MLP shapes, bench/results/overlap-2xh200-w2.json;
the table is in README.md's results): at every measured M (512 to 16384), 4.5-20%
faster than NCCL all-gather + torch.matmul, hiding 85.8% or more of the all-gather from
M=2048.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.collectives._across as _across
import commlab.language as cl
from commlab import trace
from commlab.collectives import all_gather
from commlab.collectives._common import comm_or_raise, launch_for
from commlab.overlap import _args, _buffers, _launch, _operands, _timeline
from commlab.overlap._dispatch import run
from commlab.overlap._tiles import grouped_tile, mma, stamp, store_tile, tail_combine, tail_part
from commlab.runtime.communicator import publishes_local_errors


@triton.jit
def ag_push_kernel(
    # Local buffers
    a_ptr,  # [ROWS, K] this rank's shard
    # Symmetric buffers
    gathered_ptr,  # [W, ROWS, K] this call's slot of the gathered buffer
    flags_ptr,  # int32 [W]: flags[r] = last call whose chunk r has landed here
    ctx,
    trace_ptr,
    # Sizes
    NUMEL,  # ROWS * K
    epoch,
    # Meta-parameters
    BLOCK: tl.constexpr,
    TRACE: tl.constexpr,
):
    # CPU producer: one program pushes this rank's shard into every peer's slot.
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    for i in range(1, world):
        peer = (me + i) % world
        if TRACE:
            stamp(trace_ptr, i - 1, 0, i - 1, TRACE)
        dst = cl.symm_at(gathered_ptr + me.to(tl.int64) * NUMEL, peer, ctx)
        for start in range(0, NUMEL, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < NUMEL
            tl.store(dst + offs, tl.load(a_ptr + offs, mask=mask), mask=mask)
        # our chunk of call `epoch` is on peer:
        cl.notify(flags_ptr + me, peer, ctx, epoch, sig_op="set")
        if TRACE:
            stamp(trace_ptr, i - 1, 1, i - 1, TRACE)


@triton.jit
def _ag_tile(
    a_src, b_src, out, gathered_src, flags_ptr, ctx, ws_ptr, cnt_ptr, trace_ptr,
    tile, row, j, k_lo, k_hi, landed, me, world, tiles_per_chunk,
    ROWS, N, K, stride_bk, stride_bn, epoch, TAIL, SPLIT,
    SEGMENT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, USE_TMA: tl.constexpr,
    B_TRANS: tl.constexpr, OUT_TMA: tl.constexpr, TRACE: tl.constexpr,
):
    """Output tile ``tile`` (K iterations [k_lo, k_hi): all of them, or a SEGMENT of
    tail tile j, one of SPLIT parts); returns the program's new ``landed``."""
    chunk = tile // tiles_per_chunk
    src = (me + chunk) % world  # chunk 0 is ours: it needs no communication
    pid_m, pid_n = grouped_tile(tile % tiles_per_chunk, ROWS, N, BM, BN, GROUP_M)
    if TRACE:
        stamp(trace_ptr, row, 0, tile, TRACE)

    # --- wait: the chunk's rows have landed (once per chunk per program) --------------
    if chunk > landed:
        cl.wait(flags_ptr + src, epoch, ctx)  # ctx: a lost rank aborts it
        landed = chunk
    if TRACE:
        stamp(trace_ptr, row, 1, tile, TRACE)

    # --- compute: one output tile of chunk src ----------------------------------------
    # (one main loop for both sources: two would double the pipeline's shared memory)
    if chunk == 0:
        rows_src = a_src
        row0 = src * 0
    else:
        rows_src = gathered_src
        row0 = src * ROWS
    acc = mma(rows_src, row0, ROWS, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n,
              k_lo, k_hi, BM, BN, BK, EVEN_K, USE_TMA, B_TRANS)
    acc, done = tail_combine(ws_ptr, cnt_ptr, acc, j, TAIL, SPLIT, BM, BN, SEGMENT)
    if done:
        store_tile(out, src * ROWS, ROWS, N, pid_m, pid_n, acc, BM, BN, OUT_TMA)
    if TRACE:
        stamp(trace_ptr, row, 2, tile, TRACE)
    return landed


@triton.jit(do_not_specialize=["epoch"])  # a new value every call: one variant
def ag_gemm_kernel(
    # Local buffers (tensor descriptors when USE_TMA, else pointers)
    a_src,  # [ROWS, K] this rank's shard (chunk `me` of the gathered A)
    b_src,  # [K, N] ([N, K] when B_TRANS)
    out,  # [W * ROWS, N] (store_tile)
    ws_ptr, cnt_ptr,  # split-tail workspace (tail_combine)
    # Symmetric buffers
    gathered_src,  # [W * ROWS, K] this call's slot; chunk r is written by rank r
    flags_ptr,  # int32 [W]
    ctx,
    trace_ptr,  # [TILES + programs, 6] (_launch.Schedule.trace_rows)
    # Sizes
    ROWS, N, K,
    stride_bk, stride_bn,
    epoch,
    DP_TILES, SPLIT,  # the schedule (_launch.schedule)
    # Meta-parameters
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, B_TRANS: tl.constexpr,
    OUT_TMA: tl.constexpr, TRACE: tl.constexpr,
):
    # Persistent: program p takes tiles p, p + P, p + 2P, ... of the chunk-major order,
    # so every program starts on our own chunk and reaches the peers' chunks last; the
    # tiles past DP_TILES (the partial last wave) are split along K.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    tiles_per_chunk = ((ROWS + BM - 1) // BM) * ((N + BN - 1) // BN)
    TILES = world * tiles_per_chunk
    KI = (K + BK - 1) // BK
    landed = pid * 0  # chunks (in our order) this program has seen land
    for t in tl.range(pid, DP_TILES, nprog):
        landed = _ag_tile(a_src, b_src, out, gathered_src, flags_ptr, ctx, ws_ptr, cnt_ptr,
                          trace_ptr, t, t, t, 0, KI, landed, me, world, tiles_per_chunk,
                          ROWS, N, K, stride_bk, stride_bn, epoch, TILES - DP_TILES, SPLIT,
                          False, BM, BN, BK, GROUP_M, EVEN_K, USE_TMA, B_TRANS, OUT_TMA,
                          TRACE)
    # the partial last wave, split along K (a loop of 0 or 1 trips, the same structure
    # as the loop above)
    j, k_lo, k_hi, n = tail_part(TILES - DP_TILES, KI, SPLIT)
    for _ in range(0, n):
        landed = _ag_tile(a_src, b_src, out, gathered_src, flags_ptr, ctx, ws_ptr, cnt_ptr,
                          trace_ptr, DP_TILES + j, TILES + pid, j, k_lo, k_hi, landed, me,
                          world, tiles_per_chunk, ROWS, N, K, stride_bk, stride_bn, epoch,
                          TILES - DP_TILES, SPLIT, True, BM, BN, BK, GROUP_M, EVEN_K,
                          USE_TMA, B_TRANS, OUT_TMA, TRACE)


def _push_cuda(comm, a, bufs: _buffers.Buffers, slot: torch.Tensor, epoch: int) -> torch.cuda.Event:
    """Copy-engine producer: push ``a`` to every peer's slot, then its epoch flag."""
    main = torch.cuda.current_stream(comm.device)
    side = bufs.side_stream()
    side.wait_stream(main)  # a is ready; our GEMM of the previous call has finished
    me, world = comm.rank, comm.world_size
    with torch.cuda.stream(side), trace.span("ag_gemm:push", "copy", lane="copy engine"):
        for i in range(1, world):
            p = (me + i) % world
            their_slot, their_flags = bufs.on_peer(slot, p)
            their_slot[me].copy_(a, non_blocking=True)  # contiguous D2D: a copy-engine memcpy
            torch.ops.symm_mem.stream_write_value32_(their_flags.view(-1), me, epoch)
    done = torch.cuda.Event()
    done.record(side)
    return done  # the caller's main stream waits for it before a can be freed or reused


def _fused(comm, a: torch.Tensor, b: torch.Tensor):
    """Launch the fused kernel(s); returns (out, decode), decode() adding the tile spans
    when a trace records (a host sync on GPU, so the caller runs it after its span)."""
    rows, k = a.shape
    n = b.shape[1]
    world = comm.world_size
    cfg = _launch.tile_config(comm)
    bufs = _buffers.buffers(comm, "ag_gemm", rows, k, a.dtype, 1)
    epoch = bufs.next_epoch()
    slot = bufs.data[epoch % 2]  # [W, rows, K]
    flags = bufs.flags[:, 0]  # [W]: one int32 per source rank
    out = torch.empty((world * rows, n), dtype=a.dtype, device=a.device)
    tiles = world * triton.cdiv(rows, cfg.BM) * triton.cdiv(n, cfg.BN)
    sched = _launch.schedule(comm, cfg, tiles, k)
    ws, cnt = _launch.tail_workspace(comm, sched, cfg)
    tbuf = _timeline.trace_buffer(comm, sched.trace_rows)
    ptrace = _timeline.trace_buffer(comm, world - 1)
    clock = _timeline.Clock(comm) if tbuf is not None else None
    done = None
    if comm.backend == "cuda":
        done = _push_cuda(comm, a, bufs, slot, epoch)
    else:
        lc = launch_for(comm, a.numel())
        ag_push_kernel[(1,)](a, slot, flags, comm.context, ptrace, a.numel(), epoch,
                             BLOCK=lc.block, TRACE=ptrace is not None)
    ops = _operands.operands(comm, cfg, a, b, slot.view(world * rows, k))
    dst, out_tma = _operands.output(ops, cfg, out, rows)
    ag_gemm_kernel[(sched.programs,)](
        ops.a, ops.b, dst, ws, cnt, ops.extra, flags, comm.context, tbuf,
        rows, n, k, b.stride(0), b.stride(1), epoch, sched.dp_tiles, sched.split,
        BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, GROUP_M=cfg.GROUP_M, EVEN_K=k % cfg.BK == 0,
        USE_TMA=ops.tma, B_TRANS=ops.b_trans, OUT_TMA=out_tma,
        TRACE=_launch.trace_clock(comm) if tbuf is not None else 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if done is not None:
        torch.cuda.current_stream(comm.device).wait_event(done)  # a is no longer read

    def decode():
        local = tiles // world  # our own chunk's tiles: nothing to wait for
        _timeline.add_tile_spans(comm, tbuf, clock, "ag_gemm",
                          lambda t: (None, "compute") if t < local else ("wait", "compute"))
        if comm.backend == "cpu":
            _timeline.add_tile_spans(comm, ptrace, clock, "ag_gemm", lambda t: ("copy",))
    return out, (decode if tbuf is not None else None)


def _sequential(comm, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """commlab's all-gather, then torch.matmul (on 2xH200 its kernel is faster than
    NCCL's at every size, bench/results/2xh200-w2.json)."""
    return all_gather(a) @ b


@publishes_local_errors()
def ag_gemm(a: torch.Tensor, b: torch.Tensor, *, algorithm: str = "auto") -> torch.Tensor:
    """``all_gather(a) @ b``: a is this rank's row shard [M/W, K], b is [K, N]; returns
    [M, N] (rows in rank order). Collective: every rank calls it with equal shapes.

    algorithm: "fused" (overlapped Triton kernel), "sequential" (gather, then matmul),
    or "auto" (the measured rule in ``commlab.overlap._dispatch``)."""
    comm = comm_or_raise()
    if _across.spans_hosts(comm):  # commlab inside each host, torch.distributed between
        return _across.run("ag_gemm", a, b, algorithm)
    _args.agree_args("ag_gemm", comm, a, b, algorithm, rows_divisible=False)
    nbytes = (comm.world_size - 1) * a.numel() * a.element_size()
    return run("ag_gemm", comm, a, b, algorithm, m=comm.world_size * a.shape[0], nbytes=nbytes,
               sequential=_sequential, fused=_fused)
