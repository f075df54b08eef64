"""Call records and online selection on one GPU (issue 30): run by the lead on one H200.

    python bench/checks/gpu_records_adapt.py --out bench/results/gpu-records-adapt.json

1. records: 2 ranks sharing the GPU, 12 eager all_reduce calls, rank 1 sleeping 20 ms
   before each: every call's records arrive through the lazy copy (two collects, no
   synchronisation on the call path), end >= entry on every rank, rank 1 named last;
   then 5 calls and a barrier: after ``Book.settle`` one collect hands out all of them.
2. cost: one rank (the kernel's own cost, no peer to time-slice with), records on
   against off (COMMLAB_RECORDS, read at import: one world each, alternated 3 times):
   one-shot all_reduce 8 B captured in a CUDA graph (20 calls per graph) and 1 MiB eager;
   PASS when the median cost is <= 2% (else the line says how much: records then go off
   by default, with that number in the README).
3. capture: a CUDA-graph capture of an adaptive auto call freezes the choice and says so
   on stderr; the replay gives the right sum.
4. trace: torch.profiler with CUDA activity around 4 calls; the exported trace has
   ``commlab:all_reduce`` events and, after ``trace.mark_communication``, every commlab
   kernel is named ``ncclKernel_commlab_*`` (HTA's communication rule ``^nccl.*Kernel``).
Prints PASS/FAIL per check; writes every number to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch


def _records(comm):
    import commlab
    from commlab.runtime import records

    x = torch.full((1024,), float(comm.rank + 1), device=comm.device)
    commlab.all_reduce(x)
    for _ in range(12):
        if comm.rank == 1:
            time.sleep(0.02)
        y = commlab.all_reduce(x)
    commlab.synchronize()
    ok_sum = float(y[0].item()) == 3.0
    time.sleep(0.2)
    records.collect(comm)  # starts the copy
    time.sleep(0.2)
    torch.cuda.synchronize(comm.device)
    records.collect(comm)
    time.sleep(0.1)
    recs = records.recent(comm)[-12:]
    for _ in range(5):  # Book.settle: the next collect hands out all of them at once
        commlab.all_reduce(x)
    commlab.barrier()  # every rank's calls ended, so their records are complete
    book = records.book(comm)
    book.settle()
    settled = len(records.collect(comm))
    return {"sum_ok": ok_sum, "n": len(recs), "settled": settled, "left": len(book.pending),
            "last": [r.last_rank for r in recs],
            "late_ms": [r.late_ns / 1e6 for r in recs], "wire_us": [r.wire_ns / 1e3 for r in recs],
            "ordered": all(e >= s for r in recs for s, e in zip(r.entry, r.end, strict=True))}


def _cost(comm):
    import commlab
    from commlab.bench import capture

    out = {}
    x8 = torch.ones(2, device=comm.device)
    for _ in range(5):
        commlab.all_reduce(x8, algorithm="one_shot")
    torch.cuda.synchronize()
    graph, _ = capture(comm, lambda: commlab.all_reduce(x8, algorithm="one_shot"), 20)
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / 20)
    out["graph_8B_us"] = statistics.median(ts)
    x1 = torch.ones(1 << 18, device=comm.device)
    for _ in range(10):
        commlab.all_reduce(x1, algorithm="one_shot")
    torch.cuda.synchronize()
    ts = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            commlab.all_reduce(x1, algorithm="one_shot")
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / 20)
    out["eager_1MiB_us"] = statistics.median(ts)
    return out


def _capture(comm):
    import commlab
    from commlab.bench import capture
    from commlab.collectives import _adapt

    x = torch.full((4096,), float(comm.rank + 1), device=comm.device)
    for _ in range(60):  # the C dispatch serves most of these (online selection's budget)
        commlab.all_reduce(x)
    torch.cuda.synchronize()
    graph, y = capture(comm, lambda: commlab.all_reduce(x), 1)
    graph.replay()
    torch.cuda.synchronize()
    # the captured call went to Python's pick, which froze the choice (not the dispatch)
    frozen = _adapt.key_for(comm, "all_reduce", x) in _adapt._FROZEN
    return float(y[0].item()) == float(sum(range(1, comm.world_size + 1))) and frozen


def _trace(comm, path):
    import commlab
    from commlab.trace import mark_communication

    x = torch.ones(4096, device=comm.device)
    commlab.all_reduce(x)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(4):
            commlab.all_reduce(x)
        torch.cuda.synchronize()
    if comm.rank != 0:
        return {}
    prof.export_chrome_trace(path)
    d = mark_communication(path)
    ev = d["traceEvents"]
    return {"events": sum(e.get("name") == "commlab:all_reduce" for e in ev),
            "kernels": sorted({e["name"] for e in ev if e.get("cat") == "kernel"})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu-records-adapt.json")
    a = ap.parse_args(argv)
    from commlab.testing import run_world

    rec: dict = {}
    fails = 0

    def say(ok: bool, text: str) -> None:
        nonlocal fails
        fails += not ok
        print(("PASS " if ok else "FAIL ") + text, flush=True)

    r = run_world(_records, 2, backend="cuda", timeout=600,
                  env={"COMMLAB_RECORDS": "1", "COMMLAB_ADAPT": "0"})  # GPUs default to off
    rec["records"] = r
    r0 = r[0]
    named = r0["n"] and sum(v == 1 for v in r0["last"]) >= 0.8 * r0["n"]
    say(bool(r0["sum_ok"] and r0["n"] == 12 and r0["ordered"] and named
             and r0["settled"] >= 5 and r0["left"] == 0),
        f"records: {r0['n']}/12 calls read lazily; after 5 more, a barrier and settle, one "
        f"collect read {r0['settled']} and left {r0['left']}; last ranks {r0['last']}, late ms "
        f"{[round(v, 1) for v in r0['late_ms']]}, wire us {[round(v) for v in r0['wire_us']]}")

    runs: dict = {"0": [], "1": []}
    for _ in range(3):
        for on in ("0", "1"):
            runs[on].append(run_world(_cost, 1, backend="cuda", timeout=600,
                                      env={"COMMLAB_RECORDS": on, "COMMLAB_ADAPT": "0"})[0])
    rec["cost_runs"] = runs
    for k in ("graph_8B_us", "eager_1MiB_us"):
        off = statistics.median(x[k] for x in runs["0"])
        on_ = statistics.median(x[k] for x in runs["1"])
        cost = on_ / off - 1
        rec[f"cost_{k}"] = cost
        say(cost <= 0.02, f"records cost {k}: off {off:.2f} us, on {on_:.2f} us ({cost:+.1%})")

    ok = run_world(_capture, 2, backend="cuda", timeout=600,
                   env={"COMMLAB_RECORDS": "1", "COMMLAB_ADAPT": "1"})
    rec["capture"] = ok
    say(all(ok), "capture of an adaptive auto call replays the right sum and froze the "
                 "choice (stderr: 'CUDA-graph capture froze all_reduce's online choice')")

    path = os.path.join(tempfile.mkdtemp(prefix="commlab-trace-"), "trace.json")
    t = run_world(_trace, 2, args=(path,), backend="cuda", timeout=600)[0]
    rec["trace"] = t
    marked = [k for k in t["kernels"] if k.startswith("ncclKernel_commlab_")]
    say(t["events"] >= 4 and bool(marked),
        f"trace: {t['events']} commlab:all_reduce events, kernels {t['kernels']}")

    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    print(f"wrote {a.out}; {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
