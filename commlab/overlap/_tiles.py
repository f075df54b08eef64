"""Device helpers shared by the overlapped kernels: tile order, the GEMM main loop, and
the tile clock that feeds the timeline.

Every tile of a fused kernel can stamp up to four moments (``stamp``) into a trace
buffer ``[tiles, TRACE_COLS]`` int64, together with the lane it ran on:

    col 0..3  timestamps (ns): the boundaries between the tile's roles, in order
    col 4     lane: the SM (GPU, ``%smid``) or the program id (CPU)

The clock is ``%globaltimer`` on GPU (inline PTX, behind ``cl.INTERPRET``, which the
interpreter never compiles) and the host's ``perf_counter_ns`` on CPU: the interpreter
runs plain Python called from a jit function, the same pattern as
``commlab.language._host_yield``.
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

import commlab.language as cl

TRACE_COLS = 5

if cl.INTERPRET:

    def _host_ns():  # interpreter: the tile's clock is the host's
        return time.perf_counter_ns()

else:

    @triton.jit
    def _host_ns():  # compiled: never reached; jit so the dependency scan resolves it
        return 0


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def stamp(trace_ptr, tile, col: tl.constexpr):
    """Record the current time as column ``col`` of ``tile``'s trace row (callers guard
    it with ``if TRACE:``, a constexpr, so untraced kernels carry no trace code)."""
    if cl.INTERPRET:
        now = _host_ns()
    else:
        now = _globaltimer()
    tl.store(trace_ptr + tl.cast(tile, tl.int64) * 5 + col, now)
    if col == 0:
        if cl.INTERPRET:
            lane = tl.program_id(0)
        else:
            lane = _smid()
        tl.store(trace_ptr + tl.cast(tile, tl.int64) * 5 + 4, lane.to(tl.int64))


# --- tile order -------------------------------------------------------------------


@triton.jit
def grouped_tile(t, rows, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile ``t`` of a [rows, N] output, GROUP_M row-tiles at a time,
    so consecutive tiles share the same A rows and B columns in L2. (Plain integer
    arithmetic, no tl.cdiv: every nested jit call costs the interpreter milliseconds.)"""
    num_m = (rows + BM - 1) // BM
    num_n = (N + BN - 1) // BN
    width = GROUP_M * num_n
    first_m = (t // width) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (t % width) % group_rows
    pid_n = (t % width) // group_rows
    return pid_m, pid_n


# --- the GEMM main loop ------------------------------------------------------------


@triton.jit
def mma_tile(a_ptr, stride_am, b_ptr, stride_bk, stride_bn, rows, N, K, pid_m, pid_n,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """fp32 [BM, BN] tile (pid_m, pid_n) of A @ B, A: [rows, K] row-major (stride_am),
    B: [K, N] with any strides. Rows/columns past the edge wrap (their results are
    never stored), so only K needs a mask, and none when K % BK == 0."""
    offs_m = (pid_m * BM + tl.arange(0, BM)) % rows
    offs_n = (pid_n * BN + tl.arange(0, BN)) % N
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, (K + BK - 1) // BK):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BK
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if cl.INTERPRET:  # the interpreter's 16-bit float arithmetic is not trustworthy
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK * stride_bk
    return acc


@triton.jit
def mma(a_src, row0, rows, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        USE_TMA: tl.constexpr, B_TRANS: tl.constexpr):
    """fp32 tile (pid_m, pid_n) of A[row0 : row0 + rows] @ B.

    USE_TMA (GPU, 16-byte aligned rows): ``a_src``/``b_src`` are tensor descriptors and
    the loads are TMA bulk copies (out-of-bounds reads come back as zeros; B given as
    [N, K] when B_TRANS). Otherwise they are pointers (``mma_tile``), as on CPU."""
    if USE_TMA:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, (K + BK - 1) // BK):
            a = a_src.load([row0 + pid_m * BM, k * BK])
            if B_TRANS:
                b = b_src.load([pid_n * BN, k * BK]).T
            else:
                b = b_src.load([k * BK, pid_n * BN])
            acc = tl.dot(a, b, acc)
    else:
        acc = mma_tile(a_src + tl.cast(row0, tl.int64) * K, K, b_src, stride_bk, stride_bn, rows, N,
                       K, pid_m, pid_n, BM, BN, BK, EVEN_K)
    return acc


@triton.jit
def store_tile(out, row0, rows, N, pid_m, pid_n, acc, BM: tl.constexpr, BN: tl.constexpr,
               OUT_TMA: tl.constexpr):
    """Store fp32 tile (pid_m, pid_n) of a [rows, N] block starting at row ``row0`` of
    ``out``, in out's dtype: through a TMA descriptor (OUT_TMA; exact because the host
    only asks for it when the tile cannot cross into the next block) or a pointer with
    the edge masked."""
    if OUT_TMA:
        out.store([row0 + pid_m * BM, pid_n * BN], acc.to(out.dtype))
    else:
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)
        rows_at = tl.cast(row0, tl.int64) + offs_m
        tl.store(out + rows_at[:, None] * N + offs_n[None, :],
                 acc.to(out.dtype.element_ty), mask=mask)
