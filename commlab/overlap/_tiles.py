"""Device helpers shared by the overlapped kernels: tile order, the GEMM main loop, the
split tail of the last wave, and the tile clock that feeds the timeline.

Every tile (or part of a split tile) can stamp up to four moments (``stamp``) into
a trace buffer ``[rows, TRACE_COLS]`` int64, together with where it ran:

    col 0..3  timestamps (ns): the boundaries between the tile's roles, in order
    col 4     lane: the SM (GPU, ``%smid``) or the program id (CPU)
    col 5     the output tile it worked on

The clock is chosen per target by the kernels' ``TRACE`` constexpr (0: no trace; the
host picks it, ``_launch.trace_clock``): ``CLOCK_PTX`` ``%globaltimer`` / ``%smid``
(inline PTX, NVIDIA), ``CLOCK_AMD`` ``s_memrealtime`` (AMDGCN, the 100 MHz constant
clock, ticks x 10 ns) with the program id as lane, ``CLOCK_NONE`` zeros (a target with
neither; the host says so in the trace). On CPU (``cl.INTERPRET``, never compiled) the
host's ``perf_counter_ns``: the interpreter runs plain Python called from a jit
function, the same pattern as ``commlab.language._host_yield``.

The split tail (``tail_part``, ``tail_combine``): a persistent kernel whose tiles do not
fill its last wave leaves SMs idle for up to a whole tile's time (8B all-gather GEMM,
M=8192: 3584 tiles on 132 SMs, 27.15 waves, so 112 SMs idle through the 28th). The host
(``_launch.schedule``) gives the full waves' tiles whole to the programs, round robin,
and splits each of the last wave's tiles into SPLIT parts of K, one part per program; a
tile computed in parts is combined by the program that finishes last (no program ever
waits for another).
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

import commlab.language as cl

TRACE_COLS = 6
CLOCK_PTX = 1  # TRACE values: which clock stamp() reads (0: the kernel is not traced)
CLOCK_AMD = 2
CLOCK_NONE = 3
_AMD = tl.constexpr(CLOCK_AMD)  # the same, as the device code reads them
_NONE = tl.constexpr(CLOCK_NONE)
_PTX = tl.constexpr(CLOCK_PTX)

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
def _memrealtime():
    return tl.inline_asm_elementwise("s_memrealtime $0\n s_waitcnt lgkmcnt(0)", "=s", [],
                                     dtype=tl.int64, is_pure=False, pack=1) * 10


@triton.jit
def stamp(trace_ptr, row, col: tl.constexpr, tile, CLOCK: tl.constexpr):
    """Record the current time as column ``col`` of trace row ``row``, which belongs to
    output tile ``tile``, with clock ``CLOCK`` (the kernel's TRACE; callers guard it with
    ``if TRACE:``, a constexpr, so untraced kernels carry no trace code)."""
    if cl.INTERPRET:
        now = _host_ns()
    elif CLOCK == _AMD:
        now = _memrealtime()
    elif CLOCK == _NONE:
        now = tl.cast(0, tl.int64)
    else:
        now = _globaltimer()
    base = trace_ptr + tl.cast(row, tl.int64) * 6
    tl.store(base + col, now)
    if col == 0:
        if cl.INTERPRET:
            lane = tl.program_id(0)
        elif CLOCK == _PTX:
            lane = _smid()
        else:
            lane = tl.program_id(0)
        tl.store(base + 4, lane.to(tl.int64))
        tl.store(base + 5, tl.cast(tile, tl.int64))


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
             k_lo, k_hi, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             EVEN_K: tl.constexpr):
    """fp32 [BM, BN] tile (pid_m, pid_n) of A @ B over K iterations [k_lo, k_hi) (of BK
    each), A: [rows, K] row-major (stride_am), B: [K, N] with any strides. Rows/columns
    past the edge wrap (their results are never stored), so only K needs a mask, and
    none when K % BK == 0."""
    offs_m = (pid_m * BM + tl.arange(0, BM)) % rows
    offs_n = (pid_n * BN + tl.arange(0, BN)) % N
    offs_k = tl.arange(0, BK)
    a_rows = a_ptr + offs_m[:, None].to(tl.int64) * stride_am
    b_cols = b_ptr + offs_n[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        ks = k * BK + offs_k
        a_ptrs = a_rows + ks[None, :]
        b_ptrs = b_cols + ks[:, None].to(tl.int64) * stride_bk
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=ks[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < K, other=0.0)
        if cl.INTERPRET:  # the interpreter's 16-bit float arithmetic is not trustworthy
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def mma(a_src, row0, rows, b_src, stride_bk, stride_bn, N, K, pid_m, pid_n, k_lo, k_hi,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        USE_TMA: tl.constexpr, B_TRANS: tl.constexpr):
    """fp32 tile (pid_m, pid_n) of A[row0 : row0 + rows] @ B, K iterations [k_lo, k_hi)
    (a whole tile: 0 to cdiv(K, BK); a part of a split tail tile: part of that).

    USE_TMA (GPU, 16-byte aligned rows): ``a_src``/``b_src`` are tensor descriptors and
    the loads are TMA bulk copies (out-of-bounds reads come back as zeros; B given as
    [N, K] when B_TRANS). Otherwise they are pointers (``mma_tile``), as on CPU."""
    if USE_TMA:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(k_lo, k_hi):
            a = a_src.load([row0 + pid_m * BM, k * BK])
            if B_TRANS:
                b = b_src.load([pid_n * BN, k * BK]).T
            else:
                b = b_src.load([k * BK, pid_n * BN])
            acc = tl.dot(a, b, acc)
    else:
        acc = mma_tile(a_src + tl.cast(row0, tl.int64) * K, K, b_src, stride_bk, stride_bn, rows, N,
                       K, pid_m, pid_n, k_lo, k_hi, BM, BN, BK, EVEN_K)
    return acc


# --- the split tail ------------------------------------------------------------------


@triton.jit
def tail_part(TAIL, KI, SPLIT):
    """This program's part of the partial last wave: (tail tile j, its K iterations
    [k_lo, k_hi), n) with n = 1 when it has one (programs j, j + TAIL, j + 2 TAIL, ...
    take parts 0, 1, 2, ... of tail tile j), else 0 (also when SPLIT = 0: no tail).
    Programs with the same part work on the same K range at the same time, so the tail
    tiles that share B columns read them once from L2, as whole tiles do."""
    pid = tl.program_id(0)
    rem = max(TAIL, 1)
    split = max(SPLIT, 1)
    j = pid % rem
    part = pid // rem
    n = (pid < TAIL * SPLIT).to(tl.int32)
    return j, part * KI // split, (part + 1) * KI // split, n


@triton.jit
def tail_combine(ws_ptr, cnt_ptr, acc, j, TAIL, SPLIT, BM: tl.constexpr, BN: tl.constexpr,
                 SEGMENT: tl.constexpr = True):
    """Combine tail tile ``j``, computed in SPLIT K parts by programs j, j + TAIL, ...
    (this one holds ``acc``, its part's fp32 sum). Returns (acc, done): done for exactly
    one program, the last to arrive, whose acc is then the whole tile's sum. A whole
    tile (SEGMENT False, a constexpr: no code) is done as it is.

    Each part goes to the workspace (``ws_ptr``: one [BM, BN] fp32 slot per program)
    and bumps the tile's arrival counter (``cnt_ptr``, int32, zero between launches: the
    last arrival resets it). The last arrival adds the parts in K order, its own too, so
    the rounding does not depend on who came last. Memory order as in
    ``cl.notify``/``cl.wait``: stores, CTA barrier, release; acquire, CTA barrier, loads
    (from L2: ``.cg``)."""
    if not SEGMENT:
        return acc, True
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    mine = tl.program_id(0).to(tl.int64) * (BM * BN)
    tl.store(ws_ptr + mine + offs, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's stores precede the release
    arrived = tl.atomic_add(cnt_ptr + j, 1, sem="acq_rel", scope="gpu")
    done = arrived == SPLIT - 1
    if done:
        tl.debug_barrier()  # no thread loads before the acquire
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for part in range(0, SPLIT):
            slot = (part * TAIL + j).to(tl.int64) * (BM * BN)
            acc += tl.load(ws_ptr + slot + offs, cache_modifier=".cg")
        tl.store(cnt_ptr + j, 0)  # every part has arrived: ready for the next launch
    return acc, done


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
