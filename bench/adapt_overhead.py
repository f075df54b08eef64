"""What an adaptive ``auto`` call costs over calling the algorithm it holds explicitly.

    python bench/adapt_overhead.py                          # 4 CPU ranks, 1 MiB, 64 KiB
    python bench/adapt_overhead.py --profile prof.txt       # plus cProfile of rank 0
    python bench/adapt_overhead.py --backend cuda --ranks 2 --sizes 4096,1048576
                                                            # 2 ranks sharing one GPU

The table is set to --algorithm for all_reduce, so online selection (COMMLAB_ADAPT=1)
starts on it and, once its two learning periods are over, holds it. Then blocks of --block
calls alternate (order swapped every round, a barrier before each block): ``algorithm=
<fixed>`` and ``algorithm="auto"``. Per call on rank 0: host time, whether it waited
in the agreement (the others ran ahead: ``commlab.runtime._ahead``) and, for ``auto``,
the algorithm it ran (an exploration or a switch runs another). Reported: the medians
of all calls and of the calls that ran --algorithm, the median of paired blocks'
ratios, that of the calls that ran ahead (auto's of --algorithm against the fixed
ones), the waiting calls per 100 (CUDA: a device synchronize after every call). Writes a JSON
record (--out).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _block(comm, x, algorithm: str, n: int, key) -> list[tuple[float, int, str]]:
    """``n`` calls: (rank 0's host time in µs, waiting agreements, algorithm run) each."""
    import commlab
    from commlab.collectives import _adapt

    ctl = comm.control
    out = []
    for _ in range(n):
        w0 = ctl.waits
        t = time.perf_counter()
        commlab.all_reduce(x, algorithm=algorithm)
        if comm.backend == "cuda":
            torch.cuda.synchronize(comm.device)
        dt = (time.perf_counter() - t) * 1e6
        k = _adapt._state(comm).get(key)
        ran = k.last if algorithm == "auto" and k is not None else algorithm
        out.append((dt, ctl.waits - w0, ran))
    return out


def _rank(comm, sizes, algorithm: str, rounds: int, block: int, fixed_block: int,
          profile: bool, hold: bool):
    import commlab
    from commlab.collectives import _adapt, _adapt_rules, _select

    _select.use_tuning(lambda c, op, dtype, nbytes: algorithm if op == "all_reduce" else None)
    # CPU time (process_time): on an oversubscribed box wall time lands in whatever
    # function was running when the scheduler took the core away
    prof = ({m: cProfile.Profile(time.process_time) for m in ("fixed", "auto")}
            if profile and comm.rank == 0 else {})
    res = []
    period = _adapt_rules.PERIOD
    for nbytes in sizes:
        _adapt_rules.PERIOD = period
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=comm.device)
        key = _adapt.key_for(comm, "all_reduce", x)
        _block(comm, x, algorithm, 3, key)  # compile, leave the plan
        _block(comm, x, "auto", 2 * period + 10, key)  # its learning periods over
        if hold:  # no decision, exploration or burst from here on: the pick alone
            _adapt_rules.PERIOD = 1 << 40
        calls: dict[str, list] = {"fixed": [], "auto": []}
        pairs = []
        load0 = os.getloadavg()[0]
        for r in range(rounds):
            med = {}
            for mode in (("fixed", "auto") if r % 2 == 0 else ("auto", "fixed")):
                commlab.barrier()
                p = prof.get(mode)
                if p is not None:
                    p.enable()
                got = (_block(comm, x, algorithm, fixed_block, key) if mode == "fixed"
                       else _block(comm, x, "auto", block, key))
                if p is not None:
                    p.disable()
                calls[mode] += got
                med[mode] = statistics.median(t for t, _, _ in got)
            pairs.append(med["auto"] / med["fixed"])
        commlab.synchronize()
        res.append({"bytes": nbytes, "loadavg": [load0, os.getloadavg()[0]],
                    "calls": calls, "pair_ratios": pairs,
                    "adapt": {str(k): v for k, v in _adapt.state(comm).items()}})
    text = {}
    for mode, p in prof.items():
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(25)
        text[mode] = s.getvalue()
    return {"sizes": res, "profile": text}


def summarize(s: dict, algorithm: str) -> dict:
    fixed, auto = s["calls"]["fixed"], s["calls"]["auto"]
    held = [c for c in auto if c[2] == algorithm]
    med = statistics.median
    return {"bytes": s["bytes"], "fixed_us": med(t for t, _, _ in fixed),
            "auto_us": med(t for t, _, _ in auto),
            "auto_held_us": med(t for t, _, _ in held),
            "pair_ratio_median": med(s["pair_ratios"]),
            # the calls that ran ahead (no waiting agreement), of the same algorithm
            "ahead_ratio": med(t for t, w, _ in held if not w) / med(t for t, w, _ in fixed
                                                                    if not w),
            "fixed_waits_per_100": 100 * sum(w for _, w, _ in fixed) / len(fixed),
            "auto_waits_per_100": 100 * sum(w for _, w, _ in auto) / len(auto),
            "auto_other_per_100": 100 * (len(auto) - len(held)) / len(auto),
            "loadavg": s["loadavg"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--algorithm", default="one_shot")
    ap.add_argument("--sizes", default="1048576,65536", help="bytes, comma-separated")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--fixed-block", type=int, default=None,
                    help="calls per fixed block (default --block; adapt_bench.py used 2)")
    ap.add_argument("--profile", default=None, help="write rank 0's cProfile text here")
    ap.add_argument("--hold", action="store_true",
                    help="after the learning periods, no more decisions (the pick's cost alone)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--notes", default="")
    a = ap.parse_args(argv)
    from commlab.testing import run_world

    sizes = [int(v) for v in a.sizes.split(",")]
    fixed_block = a.fixed_block or a.block
    res = run_world(_rank, a.ranks, args=(sizes, a.algorithm, a.rounds, a.block, fixed_block,
                                          a.profile is not None, a.hold),
                    backend=a.backend, timeout=3600, env={"COMMLAB_ADAPT": "1", "COMMLAB_RECORDS": "1"})[0]
    rows = [summarize(s, a.algorithm) for s in res["sizes"]]
    for r in rows:
        print(f"{r['bytes'] >> 10:5d} KiB  fixed {r['fixed_us']:8.0f} us  auto {r['auto_us']:8.0f} us"
              f" (held {r['auto_held_us']:8.0f})  paired blocks auto/fixed "
              f"{r['pair_ratio_median']:.3f}, calls that ran ahead {r['ahead_ratio']:.3f}"
              f"  waits/100: fixed {r['fixed_waits_per_100']:.0f} auto "
              f"{r['auto_waits_per_100']:.0f}  ran another/100 {r['auto_other_per_100']:.0f}"
              f"  load {r['loadavg'][0]:.1f}-{r['loadavg'][1]:.1f}")
    if a.profile:
        Path(a.profile).write_text("\n".join(f"=== {m} ===\n{t}" for m, t in res["profile"].items()))
    if a.out:
        Path(a.out).write_text(json.dumps({"ranks": a.ranks, "backend": a.backend,
                                           "algorithm": a.algorithm,
                                           "block": a.block, "fixed_block": fixed_block, "rounds": a.rounds,
                                           "notes": a.notes, "summary": rows,
                                           "sizes": res["sizes"]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
