"""Switching algorithms between calls on one GPU (issue 30 item 2): run by the lead on one H200.

    python bench/checks/gpu_adapt_switch.py --out bench/results/gpu-adapt-switch.json

Two ranks share the GPU (the IPC heap). The kernels' "no trailing barrier" arguments hold
between calls of one algorithm; two-shot's inbox A overlaps one-shot's even-call slots,
and a host agreement does not order two ranks' kernels on the device.

1. adaptive: COMMLAB_ADAPT=1, a table that says two-shot, exploration every 6th call
   (``_adapt.PERIOD`` = 6, one call per algorithm in a burst, no exploration budget),
   1200 eager all_reduce calls
   each of 1024 and 65536 fp32 elements; every result checked. PASS: none wrong (an
   algorithm change waits for every rank and meets on the device first: ``_adapt.fence``).
2. explicit alternation without a fence: COMMLAB_ADAPT=0, one_shot / two_shot / ring
   in turn at one size (the same sizes, 1200 calls each); every result checked. PASS:
   none wrong. A FAIL here is a kernel-level hazard that also reaches ``auto`` with
   COMMLAB_ADAPT=0 when one program mixes sizes the table gives different algorithms.
Prints PASS/FAIL per check; writes every number to --out. ``--backend cpu --calls 60``
runs the same harness on CPU ranks (where a host agreement does order the kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

SIZES = (1024, 65536)


def _adaptive(comm, calls):
    import commlab
    from commlab.collectives import _adapt, _select
    from commlab.runtime import records

    _select.use_tuning(lambda c, op, dtype, nbytes: "two_shot" if op == "all_reduce" else None)
    # explore often, budget off: many algorithm changes (each one fenced)
    _adapt.PERIOD, _adapt.BURST, _adapt.EXPLORE = 6, 1, 1.0
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu-adapt-switch.json")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--calls", type=int, default=1200, help="calls per size and mode")
    a = ap.parse_args(argv)
    from commlab.testing import run_world

    rec: dict = {"sizes": SIZES, "calls": a.calls, "backend": a.backend}
    fails = 0

    def say(ok: bool, text: str) -> None:
        nonlocal fails
        fails += not ok
        print(("PASS " if ok else "FAIL ") + text, flush=True)

    for name, fn, adapt in (("adaptive", _adaptive, "1"), ("explicit", _explicit, "0")):
        res = run_world(fn, 2, args=(a.calls,), backend=a.backend, timeout=600,
                        env={"COMMLAB_ADAPT": adapt})
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
