"""The overlapped kernels' per-target host choices (overlap._launch): tile, TMA and the
tile clock follow the device's (backend, arch), as the compile matrix compiles them."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from commlab.overlap import _launch, _tiles, _timeline
from commlab.trace._recorder import RECORDER


def test_tma_only_on_hopper_and_blackwell():
    assert [_launch.tma_for_target(*t) for t in
            (("cuda", 80), ("cuda", 90), ("cuda", 100), ("hip", "gfx942"), ("hip", "gfx950"))
            ] == [False, True, True, False, False]


def test_hopper_keeps_the_128x256_tile_and_a100_and_amd_take_128x128():
    assert _launch.tile_for_target("cuda", 90) == _launch.GPU_TILE == (
        _launch.TileConfig(128, 256, 64, 8, 8, 3))
    for t in (("cuda", 80), ("hip", "gfx942"), ("hip", "gfx950")):
        assert _launch.tile_for_target(*t) == _launch.SMALL_GPU_TILE
    assert _launch.tile_for_target("cpu", 0) == _launch.CPU_TILE


def test_a_tile_set_by_launch_options_holds_on_every_target():
    mine = _launch.TileConfig(64, 64, 32, 4, 4, 2)
    with _launch.launch_options(gpu_tile=mine):
        assert _launch.tile_for_target("hip", "gfx942") == mine
    assert _launch.tile_for_target("hip", "gfx942") == _launch.SMALL_GPU_TILE


def test_trace_clock_is_ptx_on_nvidia_realtime_on_amd_none_elsewhere():
    assert _launch.trace_clock_for("cuda", 90) == _tiles.CLOCK_PTX
    assert _launch.trace_clock_for("hip", "gfx942") == _tiles.CLOCK_AMD
    assert _launch.trace_clock_for("xpu", "pvc") == _tiles.CLOCK_NONE


def test_a_target_without_a_clock_says_so_in_the_trace(monkeypatch):
    comm = SimpleNamespace(backend="cuda", rank=0, device=torch.device("cpu"))
    monkeypatch.setattr(_launch, "current_target", lambda c: ("xpu", "pvc"))
    RECORDER.start()
    try:
        _timeline.add_tile_spans(comm, torch.zeros((4, 6), dtype=torch.int64), None, "ag_gemm",
                                 lambda tile: ("wait", "compute"))
        spans = list(RECORDER._pending)
    finally:
        RECORDER.active = False
    assert [s.name for s in spans] == ["ag_gemm:no tile stamps"]
    assert "no device clock" in spans[0].meta["why"]
