"""From a SIGKILL to the survivors' first correct collective, on CPU ranks.

Each world (4 CPU ranks by default, forked from one process that imported commlab once,
its store served by a process that outlives them, as torchrun's agent serves it; default
settings, COMMLAB_PEER_TIMEOUT=1) loops random collectives; a random rank (rank 0
included) is SIGKILLed at a random point (a timer anywhere, waiting in the agreement, or
inside a kernel), the survivors catch
RankLostError, call commlab.shrink() and run an all_reduce they check; then once more on
the smaller world. Per kill: ``detect`` = the slowest survivor's time from the SIGKILL to its
RankLostError, ``recover`` = the slowest survivor's time to its first correct collective
after the shrink. Goal (issue 27): recover <= 1 s on 4 CPU ranks.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 python bench/elastic_recovery.py --worlds 12
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from commlab.bench import git_commit  # noqa: E402
from tests._zygote import Zygote  # noqa: E402
from tests.test_elastic import random_plan, run_plan  # noqa: E402

ENV = {"COMMLAB_TIMEOUT": "60", "COMMLAB_PEER_TIMEOUT": "1", "OMP_NUM_THREADS": "1"}



def _summary(metric: str, world: int, values: list[float], note: str) -> dict:
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
    return {"metric": metric, "impl": "commlab:shrink", "world_size": world,
            "median_ms": 1000 * statistics.median(values), "p10_ms": 1000 * q[0],
            "p90_ms": 1000 * q[-1], "max_ms": 1000 * max(values), "n": len(values),
            "device": f"cpu x{os.cpu_count()}", "commit": git_commit(),
            "python": platform.python_version(), "note": note}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=12)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/elastic-cpu.json")
    args = ap.parse_args()
    events = []
    zygote = Zygote(env=ENV, preload=("tests.worlds.elastic",))
    for w in range(args.worlds):
        rng = random.Random(args.seed + w)
        plan = random_plan(rng, args.ranks, rounds=2)
        with tempfile.TemporaryDirectory() as d:
            for rnd in run_plan(plan, args.ranks, args.seed + w, d, zygote):
                events.append({"world_size": rnd["world"], "victim": rnd["victim"],
                               "when": rnd["when"], "delay_s": rnd["delay"],
                               "detect_s": max(rnd["detect"]),
                               "shrunk_s": max(rnd["shrunk"]),
                               "recover_s": max(rnd["recover"])})
                print(json.dumps(events[-1]), flush=True)
    zygote.close()
    records = []
    for n in sorted({e["world_size"] for e in events}, reverse=True):
        mine = [e for e in events if e["world_size"] == n]
        records.append(_summary("sigkill_to_rank_lost_error", n, [e["detect_s"] for e in mine],
                                "slowest survivor per kill; COMMLAB_PEER_TIMEOUT=1"))
        records.append(_summary("sigkill_to_shrink_returned", n, [e["shrunk_s"] for e in mine],
                                "slowest survivor per kill: commlab.shrink() returned"))
        records.append(_summary("sigkill_to_first_correct_collective", n,
                                [e["recover_s"] for e in mine],
                                "slowest survivor per kill: RankLostError, commlab.shrink(), "
                                "a checked all_reduce of 1000 floats"))
    records.append({"metric": "events", "events": events})
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    for r in records[:-1]:
        print(f"{r['metric']:40s} w{r['world_size']}: median {r['median_ms']:.0f} ms, "
              f"p90 {r['p90_ms']:.0f} ms, max {r['max_ms']:.0f} ms (n={r['n']})")


if __name__ == "__main__":
    main()
