"""Overlap metrics, chrome-trace import (torch.profiler format) and export."""

from __future__ import annotations

import json

import pytest

from commlab import trace
from commlab.trace import Span


def S(name, kind, rank, s, e, lane="stream"):
    return Span(name, kind, rank, s, e, lane=lane)


def test_overlap_ratio_is_comm_intersect_compute_over_comm():
    spans = [S("gemm", "compute", 0, 0, 100), S("ar", "comm", 0, 60, 160),
             S("gemm2", "compute", 0, 150, 170)]
    m = trace.overlap_metrics(spans)[0]
    assert m.comm_us == 100 and m.compute_us == 120
    assert m.overlap_us == 50  # [60,100] and [150,160]
    assert m.overlap_ratio == pytest.approx(0.5)
    assert m.exposed_comm_us == 50
    assert m.comm_compute_ratio == pytest.approx(100 / 120)


def test_nested_and_parallel_spans_count_once():
    spans = [S("a", "comm", 1, 0, 10), S("b", "comm", 1, 5, 15, lane="sm 3"),
             S("t", "copy", 1, 2, 4, lane="sm 4"), S("c", "compute", 1, 0, 5),
             S("r", "reduce", 1, 3, 8, lane="sm 4")]
    m = trace.overlap_metrics([s.to_dict() for s in spans])[1]
    assert m.comm_us == 15 and m.compute_us == 8 and m.overlap_us == 8


def test_ratio_warning_appears_above_the_threshold_only():
    spans = [S("gemm", "compute", 0, 0, 10), S("ar", "comm", 0, 10, 40)]
    m = trace.overlap_metrics(spans)
    assert trace.ratio_warnings(m, 5.0) == []
    (w,) = trace.ratio_warnings(m, 2.0)
    assert "rank 0" in w and "3.0x compute" in w and "30 µs exposed" in w
    only_comm = trace.overlap_metrics([S("ar", "comm", 2, 0, 5)])
    assert only_comm[2].overlap_ratio == 0 and only_comm[2].comm_compute_ratio is None
    assert "no compute spans" in trace.ratio_warnings(only_comm, 1.0)[0]


# The shape torch.profiler writes for a GPU run (events trimmed to what is read).
GPU_TRACE = {
    "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000.0, "dur": 5.0, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16", "ts": 1010.0,
         "dur": 100.0, "tid": 7, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
         "ts": 1060.0, "dur": 80.0, "tid": 13, "args": {"stream": 13}},
        {"ph": "X", "cat": "kernel", "name": "one_shot_all_reduce_kernel", "ts": 1200.0,
         "dur": 10.0, "tid": 7, "args": {"stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)",
         "ts": 1300.0, "dur": 4.0, "tid": 7, "args": {"stream": 7}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "x", "ts": 1000.0},
    ],
}


def test_torch_profiler_gpu_trace_classifies_kernels_by_name(tmp_path):
    p = tmp_path / "rank1.json"
    p.write_text(json.dumps(GPU_TRACE))
    spans = trace.load_torch_trace(p)
    kinds = {s.name: (s.kind, s.rank, s.lane) for s in spans}
    assert kinds["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == ("comm", 1, "stream 13")
    assert kinds["one_shot_all_reduce_kernel"][0] == "comm"
    assert kinds["sm90_xmma_gemm_bf16bf16"] == ("compute", 1, "stream 7")
    assert kinds["Memcpy DtoD (Device -> Device)"][0] == "memcpy"
    assert "aten::mm" not in kinds  # GPU events present: CPU ops are not the timeline
    assert min(s.start_us for s in spans) == 0.0
    m = trace.overlap_metrics(spans)[1]
    assert m.overlap_us == pytest.approx(50.0)  # nccl [50,130] under gemm [0,100]


def test_chrome_export_has_a_process_per_rank_and_a_thread_per_lane(tmp_path):
    spans = [S("gemm", "compute", 0, 0, 10), S("ar", "comm", 1, 5, 9),
             S("tile", "copy", 1, 1, 2, lane="sm 12")]
    out = trace.to_chrome_trace(spans, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == out
    xs = [e for e in out["traceEvents"] if e["ph"] == "X"]
    assert {(e["pid"], e["name"], e["cat"]) for e in xs} == {
        (0, "gemm", "compute"), (1, "ar", "comm"), (1, "tile", "copy")}
    names = {(e["pid"], e["args"]["name"]) for e in out["traceEvents"]
             if e["name"] in ("process_name", "thread_name")}
    assert {(0, "rank 0"), (1, "rank 1"), (1, "stream"), (1, "sm 12")} <= names
    # and it reads back as the same spans
    back = trace.load_torch_trace(out)
    assert sorted(s.name for s in back) == ["ar", "gemm", "tile"]


def test_span_dicts_round_trip():
    s = Span("ar", "comm", 3, 1.0, 2.0, 64, "one_shot", "stream", {"x": 1})
    d = s.to_dict()
    assert Span.from_dict(d) == s
    assert Span.from_dict({**d, "host": "n1"}).meta == {"x": 1, "host": "n1"}
