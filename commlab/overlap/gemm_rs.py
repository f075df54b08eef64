"""GEMM + reduce-scatter, overlapped: ``reduce_scatter(a @ b)`` without a separate
reduce-scatter after the GEMM.

Each rank holds ``a`` [M, K_local] and ``b`` [K_local, N]; the product is a partial sum
and rank r owns the reduction of its row chunk r. So each rank computes the chunks its
peers own first, sends each one as soon as it is finished, and computes its own chunk
last, adding the peers' partials in the epilogue of each own tile:

    per call e, chunks in order me+1, me+2, ..., me (own chunk last):
      launch "peer chunk" dst (one per peer):  stage[dst] = a[dst rows] @ b
      producer, behind that launch, per row piece i of the chunk:
                                inbox@dst[e % 2][me][piece i] = stage[dst][piece i]
                                flags@dst[me][i] = e              # piece i of our partial landed
      launch "own chunk":  per tile:  acc = a[me rows, tile] @ b
                                      for src != me: wait(flags[src][piece of the tile] >= e)
                                                     acc += inbox[e % 2][src][tile]
                                      out[tile] = acc

The pieces (row blocks of at least ``PIECE_BYTES``, up to ``MAX_PIECES``) let the own
chunk's first tiles start their epilogue when the first piece has landed, not the whole
chunk: at 8B M=16384 a peer's partial is 64 MiB, ~170 µs of copy-engine time, longer
than the first wave of tiles.

Who produces: on GPU the copy engines (``copy_`` into the peer's inbox on a side stream,
then ``cuStreamWriteValue32`` of the epoch into the peer's flag), so the bytes cross
NVLink while our own chunk's GEMM runs on every SM, and the own tiles' epilogues read
*local* memory (pulling the partials over NVLink in the own tiles' epilogues put all
of that traffic at the end of the kernel, hidden behind nothing). On CPU the host copies
into the peer's shared memory between the launches: the same protocol.

Deadlock freedom: an own-chunk program waits only for copies that the *peers* queued
behind *their* peer-chunk launches, which wait for nothing; on one GPU, no SM kernel
waits for work queued behind a spinning one.

Why no barrier: the inbox is double-buffered by call parity. Our push into slot e % 2 on
peer p is queued after our own-chunk launch of call e-1, which waited for p's push of
call e-1, which p queued after its own-chunk launch of call e-2, the last reader of that
slot. The staging buffer is reused by the next call only after the main stream has
joined the side stream (the pushes are done).

When it wins (2xH200, bf16, Llama-3 MLP shapes, bench/results/overlap-2xh200-w2.json;
the table is in README.md's results): M >= 2048, 9.7-22.8% faster than torch.matmul +
NCCL reduce-scatter, hiding 81.1% or more of the reduce-scatter. At M=512 the 32 tiles
per launch leave SMs idle even split along K, and ``algorithm="auto"`` runs
torch.matmul, then commlab's reduce-scatter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.collectives._across as _across
import commlab.language as cl
from commlab import trace
from commlab.collectives import reduce_scatter
from commlab.collectives._common import comm_or_raise
from commlab.overlap import _args, _buffers, _launch, _operands, _timeline
from commlab.overlap._dispatch import run
from commlab.overlap._tiles import grouped_tile, mma, stamp, store_tile, tail_combine, tail_part
from commlab.runtime.communicator import publishes_local_errors


@triton.jit
def _add_partials(acc, inbox, me, world, pid_m, pid_n, ROWS, N, BM: tl.constexpr,
                  BN: tl.constexpr, IN_TMA: tl.constexpr):
    """acc + every peer's partial of tile (pid_m, pid_n) of our chunk, read from our
    inbox ([W, ROWS, N]: a TMA descriptor with [1, BM, BN] blocks when IN_TMA, else a
    pointer); the caller has seen their flags."""
    if IN_TMA:
        for i in range(1, world):
            src = (me + i) % world
            part = inbox.load([src, pid_m * BM, pid_n * BN]).reshape(BM, BN)
            acc += part.to(tl.float32)
    else:
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask = (offs_m[:, None] < ROWS) & (offs_n[None, :] < N)
        tile_off = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        for i in range(1, world):
            src = (me + i) % world
            part = tl.load(inbox + src.to(tl.int64) * ROWS * N + tile_off, mask=mask,
                           other=0.0)
            acc += part.to(tl.float32)
    return acc


@triton.jit
def _rs_tile(
    a_src, b_src, out, inbox, flags_ptr, ctx, ws_ptr, cnt_ptr, trace_ptr,
    tile, row, tid, j, k_lo, k_hi, ready, me, world, dst,
    ROWS, N, K, stride_bk, stride_bn, epoch, PIECE_TILES, TAIL, SPLIT,
    SEGMENT: tl.constexpr, OWN: tl.constexpr, MAXP: tl.constexpr, OUT_TMA: tl.constexpr,
    IN_TMA: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, B_TRANS: tl.constexpr,
    TRACE: tl.constexpr,
):
    """Tile ``tile`` of chunk dst (K iterations [k_lo, k_hi): all of them, or a SEGMENT
    of tail tile j, one of SPLIT parts); returns the program's new ``ready``. It is tile
    ``tid`` of the whole call in the trace (chunk-launch order)."""
    pid_m, pid_n = grouped_tile(tile, ROWS, N, BM, BN, GROUP_M)
    if TRACE:
        stamp(trace_ptr, row, 0, tid, TRACE)

    # --- compute: our partial of tile (pid_m, pid_n) of chunk dst ---------------------
    acc = mma(a_src, dst * ROWS, ROWS, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n,
              k_lo, k_hi, BM, BN, BK, EVEN_K, USE_TMA, B_TRANS)
    acc, done = tail_combine(ws_ptr, cnt_ptr, acc, j, TAIL, SPLIT, BM, BN, SEGMENT)
    if TRACE:
        stamp(trace_ptr, row, 1, tid, TRACE)
    if done:
        if OWN:
            # --- wait + reduce: add every peer's partial of this tile -------------------
            # (a peer's pieces land in order, so piece p's flag covers every piece <= p)
            piece = pid_m // PIECE_TILES
            if piece > ready:
                for i in range(1, world):
                    cl.wait(flags_ptr + ((me + i) % world) * MAXP + piece, epoch, ctx)
                ready = piece
            if TRACE:
                stamp(trace_ptr, row, 2, tid, TRACE)
            acc = _add_partials(acc, inbox, me, world, pid_m, pid_n, ROWS, N, BM, BN, IN_TMA)
            store_tile(out, pid_m * 0, ROWS, N, pid_m, pid_n, acc, BM, BN, OUT_TMA)
            if TRACE:
                stamp(trace_ptr, row, 3, tid, TRACE)
        else:
            # the partial, staged locally for the producer to send
            store_tile(out, pid_m * 0, ROWS, N, pid_m, pid_n, acc, BM, BN, OUT_TMA)
    return ready


@triton.jit(do_not_specialize=["epoch"])  # a new value every call: one variant
def gemm_rs_kernel(
    # Local buffers (tensor descriptors when USE_TMA, else pointers)
    a_src,  # [W * ROWS, K] this rank's activations (K = this rank's share)
    b_src,  # [K, N] ([N, K] when B_TRANS)
    out,  # [ROWS, N]: stage[chunk] (a peer's chunk) or our reduced chunk (OWN); store_tile
    ws_ptr, cnt_ptr,  # split-tail workspace (tail_combine)
    # Symmetric buffers
    inbox,  # [W, ROWS, N] this call's slot: inbox[r] = rank r's partial of our chunk
    #         (a TMA descriptor when IN_TMA)
    flags_ptr,  # int32 [W, MAXP]: flags[r][i] = last call whose piece i rank r delivered
    ctx,
    trace_ptr,  # [W * TRACE_ROWS, 6]; this launch's rows start at chunk_idx * TRACE_ROWS
    # Sizes
    ROWS, N, K,
    stride_bk, stride_bn,
    chunk_idx,  # position of this launch's chunk in our order (W - 1: our own chunk)
    epoch,
    PIECE_TILES,  # row tiles per piece of a partial chunk
    DP_TILES, SPLIT, TRACE_ROWS,  # the schedule (_launch.schedule)
    # Meta-parameters
    OWN: tl.constexpr,
    MAXP: tl.constexpr,
    OUT_TMA: tl.constexpr,
    IN_TMA: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, B_TRANS: tl.constexpr,
    TRACE: tl.constexpr,
):
    # Persistent: program p takes tiles p, p + P, ... of one row chunk of the output; the
    # tiles past DP_TILES (the partial last wave) are split along K.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    dst = (me + 1 + chunk_idx) % world  # whose rows: the peers' first, our own last
    tiles = ((ROWS + BM - 1) // BM) * ((N + BN - 1) // BN)
    KI = (K + BK - 1) // BK
    base = chunk_idx * TRACE_ROWS  # this launch's trace rows
    ready = pid * 0 - 1  # OWN: pieces 0..ready of every peer's partial have landed
    for tile in tl.range(pid, DP_TILES, nprog):
        ready = _rs_tile(a_src, b_src, out, inbox, flags_ptr, ctx, ws_ptr, cnt_ptr, trace_ptr,
                         tile, base + tile, chunk_idx * tiles + tile, tile, 0, KI, ready,
                         me, world, dst, ROWS, N, K, stride_bk, stride_bn, epoch, PIECE_TILES,
                         tiles - DP_TILES, SPLIT, False, OWN, MAXP, OUT_TMA, IN_TMA,
                         BM, BN, BK, GROUP_M, EVEN_K, USE_TMA, B_TRANS, TRACE)
    # the partial last wave, split along K (a loop of 0 or 1 trips, the same structure
    # as the loop above)
    j, k_lo, k_hi, n = tail_part(tiles - DP_TILES, KI, SPLIT)
    for _ in range(0, n):
        ready = _rs_tile(a_src, b_src, out, inbox, flags_ptr, ctx, ws_ptr, cnt_ptr, trace_ptr,
                         DP_TILES + j, base + tiles + pid, chunk_idx * tiles + DP_TILES + j,
                         j, k_lo, k_hi, ready, me, world, dst, ROWS, N, K, stride_bk,
                         stride_bn, epoch, PIECE_TILES, tiles - DP_TILES, SPLIT, True, OWN,
                         MAXP, OUT_TMA, IN_TMA, BM, BN, BK, GROUP_M, EVEN_K, USE_TMA,
                         B_TRANS, TRACE)


MAX_PIECES = 16  # flags per (source, call)
# How own tiles read the peers' partials on GPU: one TMA bulk copy per partial tile, or
# plain loads (False). TMA: an own tile's reduce 2.4-2.5 us against 3.4-3.5 (2xH200,
# bench/probes/gpu_rs_variants.py, bench/results/history/rs-epilogue-forms-2xh200.json).
PARTIALS_TMA = True
PIECE_BYTES = 4 << 20  # at least this much per copy (each copy and flag write costs ~µs)


def piece_tiles(comm, rows: int, n: int, elem_size: int, bm: int) -> int:
    """Row tiles per piece of a partial chunk: pieces of >= PIECE_BYTES (CPU: one piece
    per row tile, so the teaching shapes show several), at most MAX_PIECES."""
    row_tiles = triton.cdiv(rows, bm)
    if comm.backend == "cpu":
        return triton.cdiv(row_tiles, MAX_PIECES)
    pieces = max(1, min(MAX_PIECES, rows * n * elem_size // PIECE_BYTES))
    return triton.cdiv(row_tiles, pieces)


class _Producer:
    """Sends staged partial chunks into their owners' inboxes piece by piece, each piece
    followed by its epoch flag: copy engines on a side stream (GPU), host copies into
    shared memory (CPU)."""

    def __init__(self, comm, bufs: _buffers.Buffers, slot: torch.Tensor, epoch: int,
                 piece_rows: int):
        self.comm, self.bufs, self.slot, self.epoch = comm, bufs, slot, epoch
        self.piece_rows = piece_rows
        self.cuda = comm.backend == "cuda"
        if self.cuda:
            self.side = bufs.side_stream()
            self.main = torch.cuda.current_stream(comm.device)

    def send(self, p: int, staged: torch.Tensor) -> None:
        """Queue the push of ``staged`` (our partial of p's chunk) to rank p."""
        me, rows = self.comm.rank, staged.shape[0]
        inbox, flags = self.bufs.on_peer(self.slot, p)
        pieces = range(0, rows, self.piece_rows)
        if not self.cuda:
            with trace.span("gemm_rs:push", "copy", lane="producer"):
                for i, lo in enumerate(pieces):
                    inbox[me, lo:lo + self.piece_rows].copy_(staged[lo:lo + self.piece_rows])
                    flags[me, i] = self.epoch  # after the rows: x86 keeps store order
            return
        self.side.wait_stream(self.main)  # the chunk's launch has finished
        with torch.cuda.stream(self.side), trace.span("gemm_rs:push", "copy",
                                                      lane="copy engine"):
            flat = flags.view(-1)
            for i, lo in enumerate(pieces):  # contiguous rows: DMAs over NVLink
                inbox[me, lo:lo + self.piece_rows].copy_(staged[lo:lo + self.piece_rows],
                                                         non_blocking=True)
                torch.ops.symm_mem.stream_write_value32_(flat, me * MAX_PIECES + i, self.epoch)

    def join(self) -> None:
        """The main stream goes on only when every push has left (so the staging buffer
        is free again when the main stream next allocates)."""
        if self.cuda:
            self.main.wait_stream(self.side)


def _fused(comm, a: torch.Tensor, b: torch.Tensor, *, send: bool = True):
    """Launch the fused kernels; returns (out, decode), decode() adding the tile spans
    when a trace records (a host sync on GPU, so the caller runs it after its span).

    send=False (measurement only: the result lacks the peers' partials) launches the
    same kernels with no pushes and waits that pass at once (epoch 0): what the
    launches cost without the communication. Such a call skips the ordering that makes
    the next call's pushes safe without a barrier, so a device sync and a barrier must
    follow it (bench/probes/gpu_rs_variants.py times it in a window of its own)."""
    world, me = comm.world_size, comm.rank
    rows, n, k = a.shape[0] // world, b.shape[1], a.shape[1]
    cfg = _launch.tile_config(comm)
    tiles = triton.cdiv(rows, cfg.BM) * triton.cdiv(n, cfg.BN)
    bufs = _buffers.buffers(comm, "gemm_rs", rows, n, a.dtype, MAX_PIECES)
    epoch = bufs.next_epoch()
    slot = bufs.data[epoch % 2]  # [W, rows, N]: our inbox for this call
    if not send:
        epoch = 0
    ptiles = piece_tiles(comm, rows, n, a.element_size(), cfg.BM)
    out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    stage = torch.empty((max(world - 1, 1), rows, n), dtype=a.dtype, device=a.device)
    sched = _launch.schedule(comm, cfg, tiles, k)
    ws, cnt = _launch.tail_workspace(comm, sched, cfg)
    tbuf = _timeline.trace_buffer(comm, world * sched.trace_rows)
    clock = _timeline.Clock(comm) if tbuf is not None else None
    ops = _operands.operands(comm, cfg, a, b)
    in_tma = ops.tma and PARTIALS_TMA and _operands.tma_ok(slot)
    inbox = _operands.descriptor(slot, [1, cfg.BM, cfg.BN]) if in_tma else slot
    producer = _Producer(comm, bufs, slot, epoch, ptiles * cfg.BM)
    for c in range(world):
        own = c == world - 1
        target, out_tma = _operands.output(ops, cfg, out if own else stage[c], rows)
        gemm_rs_kernel[(sched.programs,)](
            ops.a, ops.b, target, ws, cnt, inbox, bufs.flags, comm.context, tbuf,
            rows, n, k, b.stride(0), b.stride(1), c, epoch, ptiles,
            sched.dp_tiles, sched.split, sched.trace_rows,
            OWN=own, MAXP=MAX_PIECES, OUT_TMA=out_tma, IN_TMA=in_tma,
            BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, GROUP_M=cfg.GROUP_M,
            EVEN_K=k % cfg.BK == 0, USE_TMA=ops.tma, B_TRANS=ops.b_trans,
            TRACE=_launch.trace_clock(comm) if tbuf is not None else 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if not own and send:
            producer.send((me + 1 + c) % world, stage[c])
    producer.join()

    def decode():
        own_first = (world - 1) * tiles
        _timeline.add_tile_spans(comm, tbuf, clock, "gemm_rs",
                          lambda t: ("compute",) if t < own_first
                          else ("compute", "wait", "reduce"))
    return out, (decode if tbuf is not None else None)


def _sequential(comm, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul, then commlab's reduce-scatter (on 2xH200 its kernel is faster than
    NCCL's at every size, bench/results/2xh200-w2.json)."""
    return reduce_scatter(a @ b)


@publishes_local_errors()
def gemm_rs(a: torch.Tensor, b: torch.Tensor, *, algorithm: str = "auto") -> torch.Tensor:
    """``reduce_scatter(a @ b)``: a [M, K_local], b [K_local, N] (this rank's share of
    K); returns this rank's row chunk [M/W, N] of the sum over ranks. Collective.

    algorithm: "fused" (overlapped Triton kernel), "sequential" (matmul, then
    reduce-scatter), or "auto" (the measured rule in ``commlab.overlap._dispatch``)."""
    comm = comm_or_raise()
    if _across.spans_hosts(comm):  # commlab inside each host, torch.distributed between
        return _across.run("gemm_rs", a, b, algorithm)
    _args.agree_args("gemm_rs", comm, a, b, algorithm, rows_divisible=True)
    nbytes = (comm.world_size - 1) * (a.shape[0] // comm.world_size) * b.shape[1] * a.element_size()
    return run("gemm_rs", comm, a, b, algorithm, m=a.shape[0], nbytes=nbytes,
               sequential=_sequential, fused=_fused)
