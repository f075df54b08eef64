"""Switching algorithms between calls on one GPU (issue 30 item 2): run by the lead on one H200.

    python bench/checks/gpu_adapt_switch.py --out bench/results/gpu-adapt-switch.json

Two ranks share the GPU (the IPC heap). The kernels' "no trailing barrier" arguments hold
between calls of one algorithm; two-shot's inbox A overlaps one-shot's even-call slots,
and a host agreement does not order two ranks' kernels on the device.

1. adaptive: COMMLAB_ADAPT=1, a table that says two-shot, exploration every 6th call
   (``_adapt_rules.PERIOD`` = 6, one call per algorithm in a burst, no exploration budget),
   1200 eager all_reduce calls
   each of 1024 and 65536 fp32 elements; every result checked. PASS: none wrong (an
   algorithm change waits for every rank and meets on the device first: ``_adapt.fence``).
2. explicit alternation without a fence: COMMLAB_ADAPT=0, one_shot / two_shot / ring
   in turn at one size (the same sizes, 1200 calls each); every result checked. PASS:
   none wrong. A FAIL here is a kernel-level hazard that also reaches ``auto`` with
   COMMLAB_ADAPT=0 when one program mixes sizes the table gives different algorithms.
3. held: COMMLAB_ADAPT=1, a table that says one-shot, default schedule; once each size's
   two learning periods are over, blocks of 40 ``auto`` calls alternate with 40 explicit
   ``algorithm="one_shot"`` calls (a device synchronize after each call). PASS: no
   ``auto`` call waits in the agreement except a block's first and a change of
   algorithm (rank 0's decisions travel without one), and the median of the ``auto``
   calls that ran one-shot is within 5% of the explicit ones' (``held_vs_fixed``).
Prints PASS/FAIL per check; writes every number to --out. ``--backend cpu --calls 60``
runs the same harness on CPU ranks (where a host agreement does order the kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

SIZES = (1024, 65536)


def _adaptive(comm, calls):
    import commlab
    from commlab.collectives import _adapt, _adapt_rules, _select
    from commlab.runtime import records

    _select.use_tuning(lambda c, op, dtype, nbytes: "two_shot" if op == "all_reduce" else None)
    # explore often, budget off: many algorithm changes (each one fenced)
    _adapt_rules.PERIOD, _adapt_rules.BURST, _adapt_rules.EXPLORE = 6, 1, 1.0
    _adapt_rules.HOPELESS_TIME = _adapt_rules.EXPLORE_TIME = float("inf")
    out = {}
    for n in SIZES:
        x = torch.arange(n, dtype=torch.float32, device=comm.device) * (comm.rank + 1)
        want = torch.arange(n, dtype=torch.float32, device=comm.device) * 3
        wrong = torch.zeros((), dtype=torch.int64, device=comm.device)
        for _ in range(calls):
            wrong += (commlab.all_reduce(x) != want).any()
        commlab.synchronize()
        time.sleep(0.2)  # the peers' ends of the last calls' records
        ran = [r.algorithm for r in records.recent(comm) if r.nbytes == 4 * n]
        changes = sum(a != b for a, b in zip(ran, ran[1:], strict=False))
        st = _adapt.state(comm)
        algs = sorted({a for v in st.values() for a in v["median_us"]})
        out[n] = {"wrong_calls": int(wrong), "algorithms_measured": algs,
                  "changes_in_last_records": changes, "last_records": len(ran)}
    return out


def _explicit(comm, calls):
    import commlab

    out = {}
    algs = ("one_shot", "two_shot", "ring")
    for n in SIZES:
        x = torch.arange(n, dtype=torch.float32, device=comm.device) * (comm.rank + 1)
        want = torch.arange(n, dtype=torch.float32, device=comm.device) * 3
        wrong = torch.zeros((), dtype=torch.int64, device=comm.device)
        for i in range(calls):
            wrong += (commlab.all_reduce(x, algorithm=algs[i % 3]) != want).any()
        commlab.synchronize()
        out[n] = {"wrong_calls": int(wrong)}
    return out


def _held(comm, calls):
    import statistics

    import commlab
    from commlab.collectives import _adapt, _adapt_rules, _select

    _select.use_tuning(lambda c, op, dtype, nbytes: "one_shot" if op == "all_reduce" else None)
    ctl, block = comm.control, 40
    out = {}
    for n in SIZES:
        x = torch.ones(n, dtype=torch.float32, device=comm.device)
        key = _adapt.key_for(comm, "all_reduce", x)
        for _ in range(2 * _adapt_rules.PERIOD + 10):  # the key's learning periods (probe, burst)
            commlab.all_reduce(x)
        times: dict = {"auto": [], "one_shot": []}
        unexplained = 0
        for r in range(max(1, calls // (2 * block))):
            for mode in (("auto", "one_shot") if r % 2 == 0 else ("one_shot", "auto")):
                commlab.barrier()
                prev = None
                for i in range(block):
                    w0 = ctl.waits
                    t = time.perf_counter()
                    commlab.all_reduce(x, algorithm=mode)
                    if comm.backend == "cuda":
                        torch.cuda.synchronize(comm.device)
                    dt = (time.perf_counter() - t) * 1e6
                    ran = _adapt._state(comm)[key].last if mode == "auto" else mode
                    if mode == "auto" and ctl.waits > w0 and i > 0 and ran == prev:
                        unexplained += 1
                    prev = ran
                    if ran == "one_shot":
                        times[mode].append(dt)
        med = {m: statistics.median(v) for m, v in times.items()}
        out[n] = {"median_us": med, "held_vs_fixed": med["auto"] / med["one_shot"] - 1,
                  "unexplained_waits": unexplained, "calls": {m: len(v) for m, v in
                                                              times.items()}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu-adapt-switch.json")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--calls", type=int, default=1200, help="calls per size and mode")
    a = ap.parse_args(argv)
    from commlab.testing import run_world

    rec: dict = {"sizes": SIZES, "calls": a.calls, "backend": a.backend,
                 "commit": os.environ.get("COMMLAB_COMMIT")}
    fails = 0

    def say(ok: bool, text: str) -> None:
        nonlocal fails
        fails += not ok
        print(("PASS " if ok else "FAIL ") + text, flush=True)

    # online selection learns from call records: on GPUs they are off unless asked for
    res = run_world(_held, 2, args=(a.calls,), backend=a.backend, timeout=600,
                    env={"COMMLAB_ADAPT": "1", "COMMLAB_RECORDS": "1"})
    rec["held"] = res
    for n in SIZES:
        r0 = res[0][n]
        say(all(r[n]["unexplained_waits"] == 0 for r in res),
            f"held all_reduce of {n} fp32: auto calls that waited without a change of "
            f"algorithm per rank {[r[n]['unexplained_waits'] for r in res]}")
        say(r0["held_vs_fixed"] <= 0.05,
            f"held all_reduce of {n} fp32: auto holding one_shot {r0['median_us']['auto']:.1f} "
            f"us against one_shot called explicitly {r0['median_us']['one_shot']:.1f} us "
            f"({r0['held_vs_fixed']:+.1%}, rank 0, median)")
    for name, fn, adapt in (("adaptive", _adaptive, "1"), ("explicit", _explicit, "0")):
        res = run_world(fn, 2, args=(a.calls,), backend=a.backend, timeout=600,
                        env={"COMMLAB_ADAPT": adapt, "COMMLAB_RECORDS": "1"})
        rec[name] = res
        for n in SIZES:
            wrong = [r[n]["wrong_calls"] for r in res]
            r0 = res[0][n]
            extra = (f", algorithm changes {r0['changes_in_last_records']} in the last "
                     f"{r0['last_records']} calls" if "last_records" in r0 else "")
            say(not any(wrong), f"{name} all_reduce of {n} fp32, {a.calls} calls: wrong calls "
                                f"per rank {wrong}{extra}")
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    print(f"wrote {a.out}; {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
