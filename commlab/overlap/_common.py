"""Host side shared by ag_gemm and gemm_rs: argument rules, tile configs, the per-shape
symmetric buffers with their epoch counters, peer views for the copy engine, and the
decoding of tile timestamps into trace spans."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from commlab.collectives._common import agree, dtype_name
from commlab.runtime.communicator import Communicator
from commlab.runtime.peer import peer_view
from commlab.trace._recorder import RECORDER, Span

DTYPES = (torch.bfloat16, torch.float16)
ALGORITHMS = ("auto", "fused", "sequential")


@dataclass(frozen=True)
class TileConfig:
    BM: int
    BN: int
    BK: int
    GROUP_M: int
    num_warps: int
    num_stages: int


# Hopper bf16/fp16: 128x256x64 tiles, 8 warps, 3 stages (wgmma, ~200 KiB of shared
# memory, one program per SM). CPU: small tiles so the teaching shapes have several
# tiles per chunk and the interpreter's numpy calls stay cheap.
GPU_TILE = TileConfig(128, 256, 64, 8, 8, 3)
CPU_TILE = TileConfig(16, 32, 64, 4, 1, 1)


def tile_config(comm: Communicator) -> TileConfig:
    return CPU_TILE if comm.backend == "cpu" else GPU_TILE


def refuse_capture(op: str, comm: Communicator) -> None:
    """The fused kernels number their calls on the host (epochs in kernel arguments and
    copy-engine flag writes), which a CUDA-graph replay would freeze: refuse to be
    captured rather than read stale chunks."""
    if comm.backend == "cuda" and torch.cuda.is_current_stream_capturing():
        from commlab.errors import CommlabUsageError

        raise CommlabUsageError(
            f"{op}(algorithm='fused') cannot be captured in a CUDA graph: it numbers its "
            f"calls on the host, and a replay would reuse the captured numbers; inside "
            f"graphs pass algorithm='sequential' (or 'auto', which runs it there)")


def check_gemm_args(op: str, comm: Communicator, a, b, algorithm: str,
                    *, rows_divisible: bool) -> str:
    """The first rule (a, b) break on this rank, or "" (the text says the fix)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() != 2:
            return f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape it to a matrix"
        if t.dtype not in DTYPES:
            return (f"{name} has dtype {dtype_name(t.dtype)}; supported: bfloat16, float16 "
                    f"(pass {name}.bfloat16())")
        if comm.backend == "cuda" and t.device != comm.device:
            return (f"{name} is on {t.device} but this rank's device is {comm.device}; "
                    f"pass {name}.to(comm.device)")
        if comm.backend == "cpu" and t.device.type != "cpu":
            return f"{name} is on {t.device} but the backend is 'cpu'; pass {name}.cpu()"
    if a.dtype != b.dtype:
        return (f"a is {dtype_name(a.dtype)} but b is {dtype_name(b.dtype)}; "
                f"pass both in one dtype")
    if a.shape[1] != b.shape[0]:
        return (f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a.shape[1] must equal "
                f"b.shape[0] (the K dimension)")
    if min(a.shape[0], a.shape[1], b.shape[1]) == 0:
        return f"empty matrix (a {tuple(a.shape)}, b {tuple(b.shape)}); pass non-empty shapes"
    if rows_divisible and a.shape[0] % comm.world_size:
        return (f"a has {a.shape[0]} rows, not divisible by the world size "
                f"({comm.world_size}); pad M to a multiple of {comm.world_size}")
    if algorithm not in ALGORITHMS:
        return f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {algorithm!r}"
    return ""


def agree_args(op: str, comm: Communicator, a, b, algorithm: str, *,
               rows_divisible: bool) -> None:
    """Check (a, b, algorithm) on this rank and agree on them with every rank: the same
    clear error everywhere, before anything launches, when any rank's arguments break a
    rule."""
    err = check_gemm_args(op, comm, a, b, algorithm, rows_divisible=rows_divisible)
    fields = {}
    if not err:
        fields = {"a": tuple(a.shape), "b": tuple(b.shape), "dtype": str(a.dtype)}
    agree(op, None, err, algorithm=algorithm, **fields)


@dataclass
class Operands:
    """What the kernels read A and B through: TMA descriptors on GPU when the rows are
    16-byte aligned (the fast path), else plain tensors (pointers)."""

    a: object
    b: object
    extra: object  # a second A source (ag_gemm's gathered buffer), or None
    tma: bool
    b_trans: bool


_DESCRIPTORS: dict = {}  # host-side TMA descriptors by (address, shape, strides, block)
_SMS: dict = {}


def tma_ok(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and (t.shape[-1] * t.element_size()) % 16 == 0


def descriptor(t: torch.Tensor, block):
    from triton.tools.tensor_descriptor import TensorDescriptor

    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, tuple(block))
    if key not in _DESCRIPTORS:
        if len(_DESCRIPTORS) > 64:
            _DESCRIPTORS.clear()
        _DESCRIPTORS[key] = TensorDescriptor.from_tensor(t, block)
    return _DESCRIPTORS[key]


def output(ops: Operands, cfg: TileConfig, out: torch.Tensor, rows: int):
    """(what a kernel stores its [rows, N] tiles through, whether it is a TMA descriptor).

    With TMA loads, the tiles are stored through a descriptor too when that is exact:
    TMA clips at the tensor's edge, so a chunk of a taller output (ag_gemm) needs rows
    that are a multiple of BM. Measured on one H200 (bench/gpu_gemm_variants.py,
    bench/results/gemm-variants-h200.json): 1.3% faster than a pointer store for the
    8B all-gather GEMM, 0.9% for the reduce-scatter one."""
    if ops.tma and tma_ok(out) and (out.shape[0] == rows or rows % cfg.BM == 0):
        return descriptor(out, [cfg.BM, cfg.BN]), True
    return out, False


def operands(comm: Communicator, cfg: TileConfig, a: torch.Tensor, b: torch.Tensor,
             extra: torch.Tensor | None = None) -> Operands:
    b_trans = not b.is_contiguous() and b.t().is_contiguous()
    bb = b.t() if b_trans else b
    use_tma = (comm.backend == "cuda" and bb.is_contiguous() and tma_ok(a) and tma_ok(bb)
               and (extra is None or tma_ok(extra)))
    if not use_tma:
        return Operands(a, b, extra, False, False)
    b_block = [cfg.BN, cfg.BK] if b_trans else [cfg.BK, cfg.BN]
    return Operands(descriptor(a, [cfg.BM, cfg.BK]), descriptor(bb, b_block),
                    None if extra is None else descriptor(extra, [cfg.BM, cfg.BK]), True, b_trans)


CPU_PROGRAMS: int | None = None  # CPU: None = one program per tile; n = n "SMs"


def _sm_count(comm: Communicator, tiles: int) -> int:
    """Programs a persistent launch may use, all resident at once (so a program that
    waits never holds back one that has not started): one per SM on GPU; on CPU one per
    tile, or ``CPU_PROGRAMS`` to run the kernels as a GPU with that many SMs would."""
    if comm.backend == "cpu":
        return max(1, CPU_PROGRAMS or tiles)
    if comm.device not in _SMS:
        _SMS[comm.device] = torch.cuda.get_device_properties(comm.device).multi_processor_count
    return _SMS[comm.device]


# --- the split tail ------------------------------------------------------------------

SPLIT_TAIL = True  # False: every tile whole (the benchmark compares both)
TAIL_MAX_SPLIT = 8  # the combining program reads this many fp32 parts at most
TAIL_MIN_PART_ITERS = 4  # K iterations per part at least (each part refills the pipeline)


@dataclass(frozen=True)
class Schedule:
    """How a persistent launch of ``programs`` programs covers ``tiles`` output tiles:
    tiles [0, dp_tiles) whole, round robin (whole waves); each of the rest (the partial
    last wave) in ``split`` parts of K, one part per program (split 0: no such tail).
    Program p's part has trace row ``tiles + p``."""

    programs: int
    tiles: int
    dp_tiles: int
    split: int

    @property
    def trace_rows(self) -> int:
        return self.tiles + self.programs


def schedule(comm: Communicator, cfg: TileConfig, tiles: int, k: int, *,
             sms: int | None = None) -> Schedule:
    """Whole tiles for the full waves; the partial last wave split along K.

    With tiles = full * P + rem (P programs, one per SM) and 0 < rem: the rem tiles of the
    last wave (all tiles when there are fewer than SMs) are each split into
    S = P // rem parts of K (at most TAIL_MAX_SPLIT, parts of at least
    TAIL_MIN_PART_ITERS iterations), so the last wave takes ~1/S of a tile's time instead
    of a whole one while P - rem SMs idle. No split when S < 2 (the wave is over half
    full). Without a split the grid is min(P, tiles), at least 1. ``sms`` plans for a
    GPU with that many SMs instead of this rank's device (notebooks/05-overlap)."""
    p = sms if sms is not None else _sm_count(comm, tiles)
    rem = tiles % p
    k_iters = -(-k // cfg.BK)
    split = min(p // rem, TAIL_MAX_SPLIT, k_iters // TAIL_MIN_PART_ITERS) if rem else 0
    if not SPLIT_TAIL or split < 2:
        return Schedule(max(1, min(p, tiles)), tiles, tiles, 0)
    return Schedule(p, tiles, tiles - rem, split)


_WORKSPACES: dict = {}


def tail_workspace(comm: Communicator, sched: Schedule, cfg: TileConfig):
    """(fp32 part slots [programs, BM * BN], int32 arrival counters [programs], zero) for
    a launch with a split tail; cached per device and stream (launches on one stream run
    one after another, so they can share it). Without a split the kernels never touch
    them: one-element placeholders (no 17 MiB of slots for nothing)."""
    if not sched.split:
        key = (str(comm.device), "none")
        if key not in _WORKSPACES:
            _WORKSPACES[key] = (torch.empty(1, dtype=torch.float32, device=comm.device),
                                torch.zeros(1, dtype=torch.int32, device=comm.device))
        return _WORKSPACES[key]
    stream = torch.cuda.current_stream(comm.device).cuda_stream if comm.backend == "cuda" else 0
    key = (str(comm.device), stream, cfg.BM, cfg.BN)
    have = _WORKSPACES.get(key)
    if have is None or have[1].numel() < sched.programs:
        n = max(sched.programs, 1)
        _WORKSPACES[key] = have = (
            torch.empty((n, cfg.BM * cfg.BN), dtype=torch.float32, device=comm.device),
            torch.zeros(n, dtype=torch.int32, device=comm.device))
    return have


# --- per-shape symmetric buffers ---------------------------------------------------


@dataclass
class Buffers:
    """Symmetric buffers of one (op, shape, dtype, tiles), allocated collectively.

    ``data`` is double-buffered by call parity; ``flags`` hold epochs (call numbers),
    so a waiter compares with ``>= epoch`` and nothing is ever reset."""

    comm: Communicator
    data: torch.Tensor  # [2, W, rows, cols]
    flags: torch.Tensor  # int32 [W, n_flags]
    epoch: int = 0
    _cache: dict = field(default_factory=dict)  # side stream, peer views (host time matters)

    def next_epoch(self) -> int:
        self.epoch += 1
        return self.epoch

    def side_stream(self) -> torch.cuda.Stream:
        """The stream this buffer's copy-engine producer runs on (CUDA)."""
        if "stream" not in self._cache:
            self._cache["stream"] = torch.cuda.Stream(self.comm.device)
        return self._cache["stream"]

    def on_peer(self, slot: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(``slot`` of ``data``, ``flags``) as they live on rank p: host copies into
        them are copy-engine copies (CUDA) or memcpys into shared memory (CPU). The
        flags are uint32 on CUDA, the type stream writes take."""
        key = (p, slot.data_ptr())
        if key not in self._cache:
            flags = torch.uint32 if self.comm.backend == "cuda" else None
            self._cache[key] = (peer_view(self.comm, slot, p),
                                peer_view(self.comm, self.flags, p, flags))
        return self._cache[key]


_CACHE: OrderedDict = OrderedDict()
_CACHE_PER_OP = 1  # big buffers: keep the last shape of each op


def buffers(comm: Communicator, op: str, rows: int, cols: int, dtype: torch.dtype,
            n_flags: int) -> Buffers:
    """The cached buffers for this shape (allocating them collectively if new).

    Every rank reaches here with the same arguments (``agree`` ran first), so every
    rank allocates, evicts and counts epochs in the same order."""
    from commlab.collectives.barrier import barrier
    from commlab.runtime.communicator import symmetric_empty, symmetric_zeros

    if any(b.comm is not comm for b in _CACHE.values()):
        _CACHE.clear()  # a new communicator (finalize + init): the old heap is gone
    key = (op, rows, cols, dtype, n_flags)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    same_op = [k for k in _CACHE if k[0] == op]
    if len(same_op) >= _CACHE_PER_OP:
        comm.synchronize()
        barrier()  # no rank's kernel still reads or writes the buffers we drop
        for k in same_op[: len(same_op) - _CACHE_PER_OP + 1]:
            del _CACHE[k]
    data = symmetric_empty((2, comm.world_size, rows, cols), dtype)
    flags = symmetric_zeros((comm.world_size, n_flags), torch.int32)
    _CACHE[key] = Buffers(comm, data, flags)
    return _CACHE[key]


def clear_cache() -> None:
    """Drop cached buffers (tests and commlab.finalize() users)."""
    _CACHE.clear()


# --- tile timeline -----------------------------------------------------------------


def trace_buffer(comm: Communicator, rows: int) -> torch.Tensor | None:
    """A [rows, 6] int64 buffer when a trace is recording, else None (columns:
    ``_tiles.stamp``)."""
    if not RECORDER.active:
        return None
    return torch.zeros((max(rows, 1), 6), dtype=torch.int64, device=comm.device)


class Clock:
    """Maps a launch's tile clock (ns) onto the recorder's time axis (us)."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.mark = RECORDER._stamp(comm.device)  # CPU: host ns; CUDA: an event

    def origin_us(self, tile_t0_ns: int) -> tuple[float, int]:
        """(where the launch starts on the recorder's axis, the tile clock there)."""
        if isinstance(self.mark, int):
            return (self.mark - RECORDER._t0_ns) / 1e3, self.mark
        torch.cuda.synchronize(self.comm.device)
        return RECORDER._t0_event.elapsed_time(self.mark) * 1e3, tile_t0_ns


def add_tile_spans(comm: Communicator, trace: torch.Tensor, clock: Clock, op: str,
                   roles_of) -> None:
    """Decode ``trace`` ([rows, 6]: four stamps, the lane, the tile) into one Span per
    role; rows never stamped are skipped.

    ``roles_of(tile)`` names the roles between consecutive stamps, e.g.
    ("wait", "compute") for a tile stamped at columns 0, 1, 2 (None: no span). A tile
    computed in parts (a split tail) has one row per part: their spans share the tile."""
    rows = trace.cpu().tolist()
    started = [r[0] for r in rows if r[0]]
    if not started:
        return
    base_us, base_ns = clock.origin_us(min(started))
    lane_word = "program" if comm.backend == "cpu" else "sm"
    for r in rows:
        if not r[0]:
            continue
        tile = r[5]
        roles = roles_of(tile)
        for i, role in enumerate(roles):
            t0, t1 = r[i], r[i + 1]
            if role is None or not (t0 and t1):
                continue
            RECORDER.add(Span(
                name=f"{op}:{role}", kind=role, rank=comm.rank,
                start_us=base_us + (t0 - base_ns) / 1e3, end_us=base_us + (t1 - base_ns) / 1e3,
                lane=f"{lane_word} {r[4]}", meta={"op": op, "tile": tile},
            ))
