"""GEMM + reduce-scatter, overlapped: ``reduce_scatter(a @ b)`` without a separate
reduce-scatter after the GEMM.

Each rank holds ``a`` [M, K_local] and ``b`` [K_local, N]; the product is a partial sum
and rank r owns the reduction of its row chunk r. So each rank computes the chunks its
peers own first and ships each finished tile, then computes its own chunk last, adding
the peers' tiles that arrived meanwhile:

    tiles in chunk order me+1, me+2, ..., me (own chunk last), per call e:
        dst = (me + 1 + chunk) % W
        acc = a[dst rows, tile] @ b
        if dst != me:                                       # role "copy"
            part[e % 2][dst][tile] = acc;  flags@dst[me][tile] = e
        else:                                               # roles "wait", "reduce"
            for src != me: wait(flags[src][tile] >= e);  acc += part@src[e % 2][me][tile]
            out[tile] = acc

Partials are staged locally and *pulled* by their owner: SM stores across NVLink from
a GEMM epilogue stall it (measured: the copy took longer than the tile's compute),
while the owner's pull is a vectorized load at the end of its own tile.

One launch, on both backends: a tile waits only for *another rank's* tiles, never for a
tile of its own launch, so Triton's interpreter (programs one after another) cannot
deadlock. On GPU the grid is persistent with at most one program per SM (all resident
at once), and each program stages every tile its peers wait for before it reaches a
tile that waits, so every wait is eventually satisfied. (A kernel occupying SMs next
to it can delay programs, not deadlock them.)

Why no barrier: part is double-buffered by call parity. Peer p overwrites slot e % 2 at
call e+2, after its GEMM of call e+1, which waited for our tiles of call e+1, which our
launch e+1 computed after our launch e (the reader of p's slot) had finished.

When it wins (2xH200, bf16, Llama-3 MLP shapes, bench/gpu_overlap.py at 02166d0,
bench/results/overlap-2xh200-w2.json): barely. At M >= 2048 it is between 1% slower and
4% faster than torch.matmul + NCCL reduce-scatter (hiding -3 to 36% of the collective)
and 0.7-12% slower than PyTorch's fused_matmul_reduce_scatter; an earlier run of this
same kernel measured 181 µs for 8B at M=2048 (now 209), unexplained. At M=512 the few
tiles leave SMs idle and ``algorithm="auto"`` runs sequentially.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab import trace
from commlab.collectives._common import agree, comm_or_raise, peer_ptr
from commlab.overlap import _common as oc
from commlab.overlap._tiles import grouped_tile, mma, stamp


@triton.jit
def gemm_rs_kernel(
    # Local buffers (tensor descriptors when USE_TMA, else pointers)
    a_src,  # [W * ROWS, K] this rank's activations (K = this rank's share)
    b_src,  # [K, N] ([N, K] when B_TRANS)
    out_ptr,  # [ROWS, N] this rank's reduced chunk
    # Symmetric buffers
    part_ptr,  # [W, ROWS, N] this call's slot: part[r] = our partial of rank r's chunk
    flags_ptr,  # int32 [W, TILES]: flags[r][t] = last call whose tile t rank r has staged
    ctx,
    trace_ptr,
    # Sizes
    ROWS, N, K,
    stride_bk, stride_bn,
    epoch,
    # Meta-parameters
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, B_TRANS: tl.constexpr,
    TRACE: tl.constexpr,
):
    # Persistent: program p takes tiles p, p + P, ... of the chunk-major order, so every
    # program ships all its tiles for peers before it reaches a tile it must wait for.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    tiles_per_chunk = ((ROWS + BM - 1) // BM) * ((N + BN - 1) // BN)
    for t in tl.range(pid, world * tiles_per_chunk, nprog):
        chunk = t // tiles_per_chunk
        tile = t % tiles_per_chunk
        dst = (me + 1 + chunk) % world  # peers' chunks first, our own last
        pid_m, pid_n = grouped_tile(tile, ROWS, N, BM, BN, GROUP_M)
        if TRACE:
            stamp(trace_ptr, t, 0)

        # --- compute: our partial of tile (pid_m, pid_n) of chunk dst ------------------
        acc = mma(a_src, dst * ROWS, ROWS, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n,
                  BM, BN, BK, EVEN_K, USE_TMA, B_TRANS)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask = (offs_m[:, None] < ROWS) & (offs_n[None, :] < N)
        tile_off = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        if TRACE:
            stamp(trace_ptr, t, 1)

        if dst != me:
            # --- copy: stage the partial tile for its owner, then tell the owner -------
            # (a local store: SM stores across NVLink stall the GEMM; the owner's 16-byte
            # loads pull the tile instead, in its epilogue)
            staged = part_ptr + dst.to(tl.int64) * ROWS * N
            tl.store(staged + tile_off, acc.to(part_ptr.dtype.element_ty), mask=mask)
            # our partial of the owner's tile, call `epoch`, is ready:
            cl.notify(flags_ptr + me * tiles_per_chunk + tile, dst, ctx, epoch, sig_op="set")
            if TRACE:
                stamp(trace_ptr, t, 2)
        else:
            # --- wait + reduce: add every peer's partial of this tile ------------------
            for i in range(1, world):
                src = (me + i) % world
                cl.wait(flags_ptr + src * tiles_per_chunk + tile, epoch)
            if TRACE:
                stamp(trace_ptr, t, 2)
            for i in range(1, world):
                src = (me + i) % world
                theirs = peer_ptr(part_ptr + me.to(tl.int64) * ROWS * N, src, ctx)
                part = tl.load(theirs + tile_off, mask=mask, other=0.0)
                acc += part.to(tl.float32)
            tl.store(out_ptr + tile_off, acc.to(out_ptr.dtype.element_ty), mask=mask)
            if TRACE:
                stamp(trace_ptr, t, 3)


def _fused(comm, a: torch.Tensor, b: torch.Tensor):
    """Launch the fused kernel(s); returns (out, decode), decode() adding the tile spans
    when a trace records (a host sync on GPU, so the caller runs it after its span)."""
    world = comm.world_size
    rows, n, k = a.shape[0] // world, b.shape[1], a.shape[1]
    cfg = oc.tile_config(comm)
    tiles_per_chunk = triton.cdiv(rows, cfg.BM) * triton.cdiv(n, cfg.BN)
    bufs = oc.buffers(comm, "gemm_rs", rows, n, a.dtype, tiles_per_chunk)
    epoch = bufs.next_epoch()
    out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    tiles = world * tiles_per_chunk
    tbuf = oc.trace_buffer(comm, tiles)
    clock = oc.Clock(comm) if tbuf is not None else None
    ops = oc.operands(comm, cfg, a, b)
    gemm_rs_kernel[(oc.programs(comm, tiles),)](
        ops.a, ops.b, out, bufs.data[epoch % 2], bufs.flags, comm.context, tbuf,
        rows, n, k, b.stride(0), b.stride(1), epoch,
        BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, GROUP_M=cfg.GROUP_M, EVEN_K=k % cfg.BK == 0,
        USE_TMA=ops.tma, B_TRANS=ops.b_trans, TRACE=tbuf is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )

    def decode():
        own_first = (world - 1) * tiles_per_chunk
        oc.add_tile_spans(comm, tbuf, clock, "gemm_rs",
                          lambda t: ("compute", "copy") if t < own_first
                          else ("compute", "wait", "reduce"))
    return out, (decode if tbuf is not None else None)


def _sequential(comm, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The baseline: torch.matmul, then torch.distributed's reduce-scatter (NCCL on GPU;
    on CPU gloo's all-reduce and our slice of it)."""
    import torch.distributed as dist

    partial = a @ b
    rows = a.shape[0] // comm.world_size
    if comm.backend == "cuda":
        out = torch.empty((rows, b.shape[1]), dtype=a.dtype, device=a.device)
        dist.reduce_scatter_tensor(out, partial, group=comm.group)
        return out
    dist.all_reduce(partial, group=comm.cpu_group)
    return partial[comm.rank * rows:(comm.rank + 1) * rows].clone()


def gemm_rs(a: torch.Tensor, b: torch.Tensor, *, algorithm: str = "auto") -> torch.Tensor:
    """``reduce_scatter(a @ b)``: a [M, K_local], b [K_local, N] (this rank's share of
    K); returns this rank's row chunk [M/W, N] of the sum over ranks. Collective.

    algorithm: "fused" (overlapped Triton kernel), "sequential" (matmul, then
    reduce-scatter), or "auto" (the measured rule in ``commlab.overlap._dispatch``)."""
    from commlab.overlap._dispatch import choose

    comm = comm_or_raise()
    err = oc.check_gemm_args("gemm_rs", comm, a, b, algorithm, rows_divisible=True)
    fields = {}
    if not err:
        fields = {"a": tuple(a.shape), "b": tuple(b.shape), "dtype": str(a.dtype)}
    agree("gemm_rs", None, err, algorithm=algorithm, **fields)
    m, n, k = a.shape[0], b.shape[1], a.shape[1]
    algo = choose("gemm_rs", comm, m, n, k) if algorithm == "auto" else algorithm
    nbytes = (comm.world_size - 1) * (m // comm.world_size) * n * a.element_size()
    with trace.collective("gemm_rs", nbytes, algo, comm.device):
        if algo == "sequential":
            return _sequential(comm, a, b)
        oc.refuse_capture("gemm_rs", comm)
        out, decode = _fused(comm, a.contiguous(), b)
    if decode is not None:
        decode()
    return out
