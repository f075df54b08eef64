"""Launch plans' eager path (issue 29): Triton's launcher called as Triton calls it, outputs
handed out again only when nobody holds them, the eager benchmark's CPU mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commlab.collectives import _launcher, _outputs
from commlab.collectives._outputs import Outputs

ROOT = Path(__file__).resolve().parents[1]


class _Recorder:
    """Stands in for the C ``launch`` function (it needs a GPU): records its arguments."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)


def _installed_cuda_launcher():
    """Triton's own CudaLauncher class with a recording ``launch`` (no GPU needed)."""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    r = object.__new__(driver.CudaLauncher)
    r.launch = _Recorder()
    r.global_scratch_size = r.profile_scratch_size = 0
    r.global_scratch_align = r.profile_scratch_align = 1
    r.launch_cooperative_grid, r.launch_pdl, r.gsan_enabled = False, False, False
    r.arg_annotations, r.kernel_signature, r.num_ctas = ["annotations"], b"signature", 1
    return r


class _Compiled:
    def __init__(self, runner):
        self.run, self.function, self.packed_metadata = runner, 0xF00D, (8, 1, 0)


def test_c_launcher_gets_the_arguments_triton_itself_passes():
    from triton.runtime import driver

    runner = _installed_cuda_launcher()
    tier, fire = _launcher.bind(_Compiled(runner), (3, 1, 1))
    assert tier == "c" and fire is not None
    fire(77, 0x1000, 0x2000, 5, 2048)
    saved = driver._active
    driver.set_active(object())  # Triton's __call__ reads it; unused without scratch
    try:
        runner(3, 1, 1, 77, 0xF00D, (8, 1, 0), None, None, None, 0x1000, 0x2000, 5, 2048)
    finally:
        driver._active = saved
    ours, triton_s = runner.launch.calls
    assert ours == triton_s


def test_launcher_falls_back_to_run_when_the_c_tier_is_refused():
    runner = _installed_cuda_launcher()
    runner.global_scratch_size = 128  # Triton allocates per launch: its __call__ must run
    tier, fire = _launcher.bind(_Compiled(runner), (1, 1, 1))
    assert tier == "run" and fire is not None


def test_unknown_launcher_shape_keeps_kernel_grid_with_a_note():
    class Odd:
        def __call__(self, grid, stream):
            pass

    with pytest.warns(RuntimeWarning, match="ordinary launch path"):
        tier, fire = _launcher.bind(_Compiled(Odd()), (1, 1, 1))
    assert tier == "none" and fire is None


def test_output_is_reused_once_dropped():
    outs, x = Outputs(torch.empty_like), torch.ones(8)
    a = outs.take(x, 0)
    ptr = a.data_ptr()
    del a
    assert outs.take(x, 0).data_ptr() == ptr


@pytest.mark.parametrize("hold", ["tensor", "view", "storage", "autograd", "requires_grad"])
def test_output_still_held_is_never_handed_out(hold):
    outs, x = Outputs(torch.empty_like), torch.ones(8)
    a = outs.take(x, 0)
    ptr = a.data_ptr()
    keep = {"tensor": lambda: a, "view": lambda: a.view(2, 4),
            "storage": lambda: a.untyped_storage(),
            "autograd": lambda: (a * torch.ones(8, requires_grad=True)).sum(),
            "requires_grad": lambda: a.requires_grad_()}[hold]()
    if hold != "tensor":
        del a
    for _ in range(_outputs.SLOTS + 1):
        assert outs.take(x, 0).data_ptr() != ptr
    del keep


def test_output_is_not_reused_on_another_stream_or_while_capturing():
    outs, x = Outputs(torch.empty_like), torch.ones(8)
    a = outs.take(x, 1)
    ptr = a.data_ptr()
    del a
    assert outs.take(x, 2).data_ptr() != ptr  # stream 2 is not ordered after stream 1
    assert outs.take(x, 1, capturing=True).data_ptr() != ptr
    assert outs.take(x, 1).data_ptr() == ptr


def test_eager_bench_cpu_quick_writes_records(tmp_path):
    env = {**os.environ, "COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1",
           "COMMLAB_COMMIT": "abc1234"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "eager_bench.py"), "--backend", "cpu", "--quick",
         "--ops", "all_reduce,all_gather", "--out-dir", str(tmp_path), "--name", "t"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads((tmp_path / "t-eager-w1.json").read_text())
    keys = {"op", "impl", "dtype", "bytes", "world_size", "time_us", "algbw_gbps",
            "busbw_gbps", "device", "commit", "mode"}
    assert records and all(set(r) == keys for r in records)
    assert {(r["op"], r["impl"], r["mode"], r["commit"]) for r in records} == {
        ("all_reduce", "commlab:auto", "eager", "abc1234"),
        ("all_gather", "commlab:auto", "eager", "abc1234")}
    extra = json.loads((tmp_path / "t-eager-w1-extra.json").read_text())
    assert not extra["failures"]
    impls = {r["impl"] for r in extra["rows"]}
    assert {"commlab:auto(legacy)", "torch_backend:commlab"} <= impls
    profile = (tmp_path / "t-eager-w1-profile.txt").read_text()
    assert "legacy plan" in profile and "current plan" in profile and "function calls" in profile
