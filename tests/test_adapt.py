"""Call records, the late rank named from them, online selection, profiler events."""

from __future__ import annotations

import json
import time

import pytest
import torch
import triton

import commlab
import commlab.language as cl
from commlab.trace import chrome


def _late_rank_one(comm):
    from commlab.runtime import records
    from commlab.trace import straggler, straggler_text

    x = torch.full((1000,), float(comm.rank + 1))
    commlab.all_reduce(x)  # compile, leave a plan: the next calls run ahead
    commlab.synchronize()
    records.collect(comm)
    for _ in range(6):
        if comm.rank == 1:
            time.sleep(0.05)
        y = commlab.all_reduce(x)
        assert float(y[0]) == 3.0
    commlab.synchronize()
    time.sleep(0.2)  # synchronize() waits for this rank's kernels, not the peer's ends
    recs = records.collect(comm)[-6:]  # the first call's record may come only now
    return {"n": len(recs), "last": [r.last_rank for r in recs],
            "late_ms": [r.late_ns / 1e6 for r in recs], "wire": [r.wire_ns for r in recs],
            "summary": straggler(recs), "text": straggler_text(recs),
            "algs": sorted({r.algorithm for r in recs})}


def test_arrival_records_name_the_rank_that_came_late(world):
    res = world(_late_rank_one, 2)
    for r in res:
        assert r["n"] == 6, r
        assert r["summary"]["rank"] == 1 and r["summary"]["share"] >= 0.8, r
        assert r["summary"]["late_ms"] > 20, r  # it slept 50 ms before each call
        assert all(w > 0 for w in r["wire"])
        assert r["text"].startswith("rank 1 arrived last in"), r["text"]
    assert res[0]["last"] == res[1]["last"]  # every rank reads the same records


@triton.jit
def stamp_kernel(ctx):
    cl.timestamp(ctx, 3)
    cl.timestamp(ctx, 4)


def _stamps(comm):
    from commlab.runtime import records

    before = time.monotonic_ns()
    stamp_kernel[(1,)](comm.context)
    after = time.monotonic_ns()
    s = records.stamps(comm)
    return before <= s[3] <= s[4] <= after and s[0] == 0


def test_a_user_kernel_stamps_the_clock_the_host_reads(world):
    assert world(_stamps, 2) == [True, True]


def _wrong_table(comm, n_calls):
    from commlab.collectives import _adapt, _select

    # a table that says two-shot for this size: at 4 KiB on two CPU ranks one-shot takes
    # about half two-shot's time (one signal round against two)
    _select.use_tuning(lambda c, op, dtype, nbytes: "two_shot" if op == "all_reduce" else None)
    x = torch.arange(1024, dtype=torch.float32) * (comm.rank + 1)
    algs = []
    for _ in range(n_calls):
        y = commlab.all_reduce(x)
        torch.testing.assert_close(y, torch.arange(1024, dtype=torch.float32) * 3)
    commlab.synchronize()
    st = next(iter(_adapt.state(comm).values()))
    algs.append(st["current"])
    return {"current": st["current"], "table": st["table"], "history": st["history"]}


def test_online_selection_leaves_a_wrong_table_choice_on_every_rank(world):
    res = world(_wrong_table, 2, 110, env={"COMMLAB_ADAPT": "1"}, timeout=400)
    assert {r["table"] for r in res} == {"two_shot"}
    assert res[0]["current"] == res[1]["current"] != "two_shot", res
    assert res[0]["history"], "rank 0 recorded no decision"


def _adapt_off(comm):
    from commlab.collectives import _adapt

    x = torch.ones(256)
    for _ in range(60):
        commlab.all_reduce(x)
    commlab.synchronize()
    return _adapt.state(comm), comm.control.seq


def test_adapt_off_runs_the_table_and_makes_no_extra_agreement(world):
    res = world(_adapt_off, 2, env={"COMMLAB_ADAPT": "0"})
    for state, _seq in res:
        assert state == {}


def _profiled(comm, path):
    x = torch.ones(64, 4) * (comm.rank + 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        commlab.all_reduce(x, algorithm="one_shot")
        commlab.all_gather(x)
    commlab.synchronize()
    if comm.rank == 0:
        prof.export_chrome_trace(path)
    return True


def test_profiler_events_are_named_commlab_op_with_shape_bytes_and_algorithm(world, tmp_path):
    path = str(tmp_path / "prof.json")
    world(_profiled, 2, path)
    events = json.loads(open(path).read())["traceEvents"]
    ours = {e["name"]: e for e in events if str(e.get("name", "")).startswith("commlab:")}
    assert {"commlab:all_reduce", "commlab:all_gather"} <= set(ours), sorted(ours)
    ar = ours["commlab:all_reduce"]
    args = ar.get("args", {})
    assert (args.get("shape"), args.get("bytes"), args.get("algorithm")) == (
        "[64, 4]", 1024, "one_shot"), ar
    spans = commlab.trace.load_torch_trace(path)
    assert {s.kind for s in spans if s.name.startswith("commlab:")} == {"comm"}


def test_exported_trace_marks_commlab_kernels_as_communication_for_hta():
    hta_utils = pytest.importorskip("hta.utils.utils")
    trace = {"traceEvents": [
        {"name": "one_shot_all_reduce_kernel", "cat": "kernel", "ph": "X", "ts": 0, "dur": 5},
        {"name": "ncclDevKernel_AllReduce_Sum_f32", "cat": "kernel", "ph": "X", "ts": 6,
         "dur": 5},
        {"name": "ampere_sgemm_128x64_nn", "cat": "kernel", "ph": "X", "ts": 12, "dur": 9}]}
    before = [hta_utils.get_kernel_type(e["name"]) for e in trace["traceEvents"]]
    assert before == ["COMPUTATION", "COMMUNICATION", "COMPUTATION"]
    out = chrome.mark_communication(trace)
    kinds = [hta_utils.get_kernel_type(e["name"]) for e in out["traceEvents"]]
    assert kinds == ["COMMUNICATION", "COMMUNICATION", "COMPUTATION"]
    assert out["traceEvents"][0]["args"]["commlab_kernel"] == "one_shot_all_reduce_kernel"


def test_arrival_spans_export_as_a_perfetto_trace_with_wait_and_comm_categories():
    from commlab.runtime.records import CallRecord
    from commlab.trace import arrival_spans, to_chrome_trace

    recs = [CallRecord("all_reduce", "one_shot", 4096, "float32", k,
                       [1000 + 10 * k, 5000 + 10 * k], [5100, 5100], [9000 + k, 9100 + k])
            for k in range(1, 4)]
    d = to_chrome_trace(arrival_spans(recs))
    cats = {(e["pid"], e["cat"]) for e in d["traceEvents"] if e["ph"] == "X"}
    assert cats == {(0, "wait"), (0, "comm"), (1, "comm")}
    assert recs[0].last_rank == 1 and recs[0].late_ns == 4000
