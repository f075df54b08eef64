"""How a persistent launch covers its output: the tile configuration, the programs
(one per SM), the schedule of whole tiles and the split last wave, and the split
tail's fp32 workspace."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton

from commlab.overlap import _tiles
from commlab.runtime import Communicator


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
# A100 (sm_80) and AMD: the 128x256 tile spills there (bench/results/compile-targets.json)
SMALL_GPU_TILE = TileConfig(128, 128, 64, 8, 8, 3)
_TILE_SET = False  # launch_options(gpu_tile=...) is in force: GPU_TILE on every target


def current_target(comm: Communicator) -> tuple[str, int | str]:
    """(backend, arch) of this rank's device as Triton compiles for it: ("cuda", 90),
    ("hip", "gfx942"); ("cpu", 0) on the CPU backend."""
    if comm.backend == "cpu":
        return "cpu", 0
    t = triton.runtime.driver.active.get_current_target()
    return t.backend, t.arch


def tma_for_target(backend: str, arch: int | str) -> bool:
    """TMA descriptors only on Hopper and Blackwell (sm_90+); elsewhere the pointer path."""
    return backend == "cuda" and isinstance(arch, int) and arch >= 90


def tile_for_target(backend: str, arch: int | str) -> TileConfig:
    """The GEMM tile a launch on that target uses."""
    if backend == "cpu":
        return CPU_TILE
    return GPU_TILE if _TILE_SET or tma_for_target(backend, arch) else SMALL_GPU_TILE


def trace_clock_for(backend: str, arch: int | str) -> int:
    """The kernels' TRACE value on that target (_tiles.CLOCK_*)."""
    if backend in ("cuda", "cpu"):
        return _tiles.CLOCK_PTX  # CPU: the interpreter reads the host clock whatever it is
    return _tiles.CLOCK_AMD if backend == "hip" else _tiles.CLOCK_NONE


def tile_config(comm: Communicator) -> TileConfig:
    return tile_for_target(*current_target(comm))


def use_tma(comm: Communicator) -> bool:
    return tma_for_target(*current_target(comm))


def trace_clock(comm: Communicator) -> int:
    return trace_clock_for(*current_target(comm))


CPU_PROGRAMS: int | None = None  # CPU: None = one program per tile; n = n "SMs"
_SMS: dict = {}  # multiprocessor count by device


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
        key: tuple[str | int, ...] = (str(comm.device), "none")
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


@contextlib.contextmanager
def launch_options(*, gpu_tile: TileConfig | None = None, split_tail: bool | None = None,
                   cpu_programs: int | None = None):
    """Run the overlapped kernels under other launch options inside the block, then
    restore them: ``gpu_tile`` (the GPU tile configuration), ``split_tail`` (False: every
    tile whole), ``cpu_programs`` (CPU: run as a GPU with that many SMs would). For
    benchmarks and notebooks; every rank must use the same options."""
    global GPU_TILE, SPLIT_TAIL, CPU_PROGRAMS, _TILE_SET
    saved = GPU_TILE, SPLIT_TAIL, CPU_PROGRAMS, _TILE_SET
    if gpu_tile is not None:
        GPU_TILE, _TILE_SET = gpu_tile, True
    if split_tail is not None:
        SPLIT_TAIL = split_tail
    if cpu_programs is not None:
        CPU_PROGRAMS = cpu_programs
    try:
        yield
    finally:
        GPU_TILE, SPLIT_TAIL, CPU_PROGRAMS, _TILE_SET = saved
