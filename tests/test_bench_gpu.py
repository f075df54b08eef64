"""commlab.bench on 2 GPUs: eager and CUDA-graph timing of every implementation, each
verified against NCCL first (run by ``pytest -m gpu`` on the GPU machine)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from commlab.bench.__main__ import SAFE_ENV
from commlab.testing import run_world

pytestmark = pytest.mark.gpu

SIZES = (8, 1 << 20)


def gpu_bench_world(comm):
    from commlab import bench

    res = bench.run(comm, sizes=SIZES, dtype="bfloat16", modes=("eager", "graph"), iters=3,
                    progress=False)
    return {"records": [asdict(r) for r in res.records],
            "failures": [str(f) for f in res.failures], "skipped": res.skipped}


@pytest.fixture(scope="module")
def gpu2():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")
    return run_world(gpu_bench_world, 2, backend="cuda", timeout=400,
                     env={**SAFE_ENV, "COMMLAB_TIMEOUT": "120"})


def test_every_implementation_passes_verification_on_gpu(gpu2):
    assert gpu2[0]["failures"] == [], gpu2[0]["failures"]


def test_commlab_and_nccl_are_timed_in_eager_and_graph_mode(gpu2):
    recs = gpu2[0]["records"]
    have = {(r["op"], r["impl"], r["mode"], r["bytes"]) for r in recs}
    from commlab.bench import OPS

    for op in OPS:
        commlab_impl = "commlab:two_shot" if op == "all_reduce" else "commlab:direct"
        for impl in ("nccl", commlab_impl):
            for mode in ("eager", "graph"):
                n = sum(1 for h in have if h[:3] == (op, impl, mode))
                assert n == len(SIZES), (op, impl, mode, sorted(have))
    assert all(r["time_us"] > 0 and "H" in r["device"] for r in recs)


def test_copy_engine_algorithms_are_verified_and_timed_eager_and_in_graphs(gpu2):
    # verified against NCCL first (a failure would be in "failures"), replayed from a
    # CUDA graph (the flags count exchanges on the device)
    have = {(r["op"], r["mode"]) for r in gpu2[0]["records"]
            if r["impl"] == "commlab:copy_engine"}
    assert have == {(op, m) for op in ("all_gather", "all_to_all", "broadcast")
                    for m in ("eager", "graph")}, sorted(have)


def test_torch_symm_mem_all_reduce_is_timed_or_skipped_with_a_reason(gpu2):
    recs = gpu2[0]["records"]
    for algo, op_name in (("one_shot", "one_shot_all_reduce"),
                          ("two_shot", "two_shot_all_reduce_")):
        impl = f"torch_symm_mem:{algo}"
        if not hasattr(torch.ops.symm_mem, op_name):
            continue
        timed = [r for r in recs if r["impl"] == impl]
        skipped = [s for s in gpu2[0]["skipped"] if s.startswith(impl)]
        assert len(timed) + len(skipped) >= len(SIZES), (impl, skipped)
