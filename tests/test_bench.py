"""commlab.bench: records, formulas, verification before timing (CPU, 2 ranks)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
import torch.distributed as dist

from commlab import bench
from commlab.bench._impls import Impl, Prepared, input_numel
from commlab.bench._records import Record, size_range
from commlab.testing import run_world

SIZES = (8, 4096)
SCHEMA = {"op", "impl", "dtype", "bytes", "world_size", "time_us", "algbw_gbps",
          "busbw_gbps", "device", "commit", "mode"}


# --- rank functions (module level: the spawned ranks import them) ---------------------


def _wrong_prepare(comm, x):
    """Deliberately wrong all_reduce: right on rank 0, off by 1e-2 on rank 1 only, so the
    verdict must travel to every rank."""
    def call():
        y = x.clone()
        dist.all_reduce(y, group=comm.group)
        return y + (1e-2 if comm.rank == 1 else 0.0)
    return Prepared(call)


def _raising_prepare(comm, x):
    def call():
        raise RuntimeError("this implementation always fails")
    return Prepared(call)


def bench_world(comm, tmp):
    """Everything that needs a running world, in one world (a start costs ~5 s)."""
    extra = (Impl("commlab:wrong_on_rank1", "all_reduce", _wrong_prepare),
             Impl("commlab:raises", "broadcast", _raising_prepare),
             Impl("torch_symm_mem:raises", "all_to_all", _raising_prepare, optional=True),
             Impl("torch_symm_mem:wrong", "all_reduce", _wrong_prepare, optional=True))
    res = bench.run(comm, sizes=SIZES, dtype="float32", iters=2, progress=False,
                    modes=("eager", "graph"),
                    algorithms=["gloo", "one_shot", "direct", "wrong_on_rank1", "raises",
                                "torch_symm_mem:wrong"],
                    extra_impls=extra)
    path = None
    if comm.rank == 0:
        path = str(bench.write_records(bench.results_path(tmp, comm), res.records))
    return {"records": [asdict(r) for r in res.records],
            "failures": [(f.op, f.impl, f.nbytes, f.mode, f.message) for f in res.failures],
            "skipped": res.skipped, "path": path,
            "graph_like": _kernels_without_host_agreement(comm)}


def _kernels_without_host_agreement(comm):
    """What a CUDA-graph replay does: the staging copies and kernels of all_reduce, called
    back to back with no host agreement in between, must still be right every time (the
    device-side barriers reset themselves)."""
    from commlab.collectives.all_reduce import _IMPLS

    errors = []
    for name, body in _IMPLS.items():
        for i in range(3):
            x = torch.randn(1000 + 17 * i, generator=torch.Generator().manual_seed(comm.rank + i))
            out = torch.empty_like(x)
            body(comm, x, out, 0)
            ref = x.clone()
            dist.all_reduce(ref, group=comm.cpu_group)
            if not torch.allclose(out, ref, atol=1e-5):
                errors.append(f"{name} call {i}")
    return errors


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("results")
    return run_world(bench_world, 2, args=(str(tmp),), timeout=300,
                     env={"COMMLAB_TIMEOUT": "60"})


# --- with a world ------------------------------------------------------------------


def test_bench_records_every_op_and_size_with_the_documented_schema(run2):
    recs = run2[0]["records"]
    assert recs and all(set(r) == SCHEMA for r in recs)
    got = {(r["op"], r["impl"], r["bytes"]) for r in recs}
    for op in bench.OPS:
        commlab_impl = "commlab:one_shot" if op == "all_reduce" else "commlab:direct"
        for impl in ("gloo", commlab_impl):
            n = sum(1 for r in recs if r["op"] == op and r["impl"] == impl)
            assert n == len(SIZES), (op, impl, got)
    assert all(r["world_size"] == 2 and r["mode"] == "eager" and r["dtype"] == "float32"
               and r["time_us"] > 0 for r in recs)
    assert all(r["device"].startswith("cpu") and r["commit"] for r in recs)


def test_bandwidth_follows_nccl_tests_formulas_by_hand(run2):
    factor = {"all_reduce": 2 * 1 / 2, "all_gather": 1 / 2, "reduce_scatter": 1 / 2,
              "all_to_all": 1 / 2, "broadcast": 1.0}
    for r in run2[0]["records"]:
        algbw = r["bytes"] / (r["time_us"] / 1e6) / 1e9
        assert r["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
        assert r["busbw_gbps"] == pytest.approx(algbw * factor[r["op"]], rel=1e-9)
    # all_gather's bytes is the gathered total: 8 B of fp32 = 1 element from each rank
    ag = {r["bytes"] for r in run2[0]["records"] if r["op"] == "all_gather"}
    assert ag == {8, 4096}


def test_wrong_implementation_is_caught_on_every_rank_and_not_timed(run2):
    for rank in (0, 1):
        fails = run2[rank]["failures"]
        wrong = [f for f in fails if f[1] == "commlab:wrong_on_rank1"]
        assert {f[2] for f in wrong} == set(SIZES)
        assert all("rank 1" in f[4] and "rank 0" not in f[4] for f in wrong)
        raised = [f for f in fails if f[1] == "commlab:raises"]
        assert raised and all("always fails" in f[4] for f in raised)
        assert {f[1] for f in fails} == {"commlab:wrong_on_rank1", "commlab:raises"}
    assert not any(r["impl"] in ("commlab:wrong_on_rank1", "commlab:raises")
                   for r in run2[0]["records"])


def test_an_optional_impl_that_raises_is_skipped_with_its_reason(run2):
    for rank in (0, 1):
        got = [s for s in run2[rank]["skipped"] if s.startswith("torch_symm_mem:raises")]
        assert len(got) == len(SIZES) and all("always fails" in s for s in got)


def test_an_optional_impl_with_a_wrong_result_is_skipped_untimed_not_failed(run2):
    for rank in (0, 1):
        got = [s for s in run2[rank]["skipped"] if s.startswith("torch_symm_mem:wrong")]
        assert len(got) == len(SIZES) and all("wrong result, not timed" in s for s in got)
        assert not any(f[1] == "torch_symm_mem:wrong" for f in run2[rank]["failures"])
    assert not any(r["impl"] == "torch_symm_mem:wrong" for r in run2[0]["records"])


def test_graph_mode_is_skipped_on_cpu_with_a_reason(run2):
    assert any("graph mode" in s and "cuda" in s for s in run2[0]["skipped"])


def test_records_file_is_named_by_machine_and_world_size(run2):
    path = run2[0]["path"]
    assert path.endswith("cpu-w2.json")
    with open(path) as f:
        rows = json.load(f)
    assert len(rows) == len(run2[0]["records"]) and all(set(r) == SCHEMA for r in rows)


def test_kernels_repeat_correctly_without_host_agreement_as_graph_replay_needs(run2):
    assert run2[0]["graph_like"] == [] and run2[1]["graph_like"] == []


# --- without a world ---------------------------------------------------------------


@pytest.mark.parametrize("op,n,factor", [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75),
                                         ("all_gather", 4, 0.75), ("reduce_scatter", 2, 0.5),
                                         ("all_to_all", 8, 0.875), ("broadcast", 8, 1.0)])
def test_bus_factor_matches_nccl_tests(op, n, factor):
    assert bench.bus_factor(op, n) == pytest.approx(factor)


def test_record_bandwidths_from_bytes_and_time():
    r = Record.measured(op="all_reduce", impl="nccl", dtype="bfloat16", nbytes=1 << 30,
                        world_size=2, time_us=3289.0, device="NVIDIA H200", commit="x",
                        mode="eager")
    assert r.algbw_gbps == pytest.approx(326.47, rel=1e-3)  # 2xH200 run: 326 GB/s
    assert r.busbw_gbps == pytest.approx(r.algbw_gbps)


def test_cpu_bandwidths_are_shown_in_mb_per_s_where_gb_per_s_would_read_zero():
    cpu = [Record.measured(op="all_reduce", impl="gloo", dtype="float32", nbytes=4096,
                           world_size=2, time_us=900.0, device="cpu", commit="x",
                           mode="eager")]  # 4.6 MB/s
    table = bench.format_table(cpu)
    assert "busbw MB/s" in table and "GB/s" not in table.splitlines()[0]
    assert "4.55" in table, table  # not 0.00
    fig = bench.figure(cpu)
    assert fig.layout.yaxis2.title.text == "busbw (MB/s)"
    assert fig.data[1].y[0] == pytest.approx(4.55, rel=0.01)
    gpu = [Record.measured(op="all_reduce", impl="nccl", dtype="bfloat16", nbytes=1 << 30,
                           world_size=2, time_us=3289.0, device="H200", commit="x",
                           mode="eager")]
    assert "busbw GB/s" in bench.format_table(gpu)


def test_sizes_parse_and_ranges_are_inclusive():
    assert bench.parse_size("64KiB") == 65536 and bench.parse_size("1GiB") == 1 << 30
    assert bench.parse_size("8") == 8 and bench.parse_size("2MB") == 2_000_000
    assert size_range(8, 32, 2) == [8, 16, 32]
    # --max is measured even off the factor's grid (8 * 4^k never hits 1 MiB)
    assert size_range(8, "1MiB", 4)[-2:] == [1 << 19, 1 << 20]
    with pytest.raises(ValueError, match="64KiB"):
        bench.parse_size("lots")


def test_split_ops_round_inputs_to_whole_chunks():
    assert input_numel("reduce_scatter", 8, 4, 4) == (4, 16)  # at least one element each
    assert input_numel("all_gather", 4096, 4, 2) == (512, 4096)
    assert input_numel("all_to_all", 40, 4, 3) == (9, 36)


def test_check_reports_what_differs():
    ref = torch.ones(10)
    assert bench.check(ref.clone(), ref, 2) == ""
    assert "Mismatched" in bench.check(ref + 1, ref, 2)
    assert "shape" in bench.check(torch.ones(9), ref, 2)


def test_writing_merges_new_measurements_over_old(tmp_path):
    def rec(impl, t):
        return Record.measured(op="all_reduce", impl=impl, dtype="float32", nbytes=8,
                               world_size=2, time_us=t, device="cpu", commit="c", mode="eager")
    p = tmp_path / "cpu-w2.json"
    bench.write_records(p, [rec("gloo", 10.0), rec("commlab:one_shot", 20.0)])
    bench.write_records(p, [rec("gloo", 5.0)])
    got = {r.impl: r.time_us for r in bench.load_records(p)}
    assert got == {"gloo": 5.0, "commlab:one_shot": 20.0}


# --- %commbench ----------------------------------------------------------------------


def test_commbench_draws_recorded_results_and_rejects_bad_flags(tmp_path):
    from commlab.magics import bench as magic
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    # the process's one shell, whichever test made it first (a second shell class, as
    # IPython.testing.globalipapp makes, fails once the magics tests made theirs)
    ip = InteractiveShell.instance()
    magic.register(ip)
    recs = [Record.measured(op="all_reduce", impl=impl, dtype="bfloat16", nbytes=n,
                            world_size=2, time_us=t, device="NVIDIA H200", commit="c",
                            mode="graph")
            for impl, n, t in (("nccl", 8, 8.5), ("nccl", 1 << 20, 17.6),
                               ("commlab:two_shot", 8, 6.0), ("commlab:two_shot", 1 << 20, 10.0))]
    path = bench.write_records(tmp_path / "2xh200-w2.json", recs)
    with capture_output() as out:
        ip.run_line_magic("commbench", f"--load {path}")
    figures = [o for o in out.outputs if "application/vnd.plotly.v1+json" in o.data]
    assert "commlab:two_shot" in out.stdout and len(figures) == 1
    assert len(ip.user_ns["_commbench"]) == 4
    with pytest.raises(UsageError, match="unknown"):
        ip.run_line_magic("commbench", "--ops all_reduse")
    with pytest.raises(UsageError, match="no records"):
        ip.run_line_magic("commbench", f"--load {path} --ops broadcast")


# --- the overlap benchmark -------------------------------------------------------------


def test_overlap_benchmark_runs_as_a_module_and_lists_its_flags():
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "commlab.bench.overlap", "--help"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COMMLAB_BACKEND": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "python -m commlab.bench.overlap" in proc.stdout
    for flag in ("--out", "--rounds", "--tiles", "--trace-only"):
        assert flag in proc.stdout, flag
