"""What online selection's reading of the call records costs rank 0 on CPU.

    python bench/probes/adapt_feed_cost.py [--ranks 2] [--bytes 65536] [--calls 1500]

Runs ``auto`` all_reduce calls on a CPU world and times every ``_adapt.feed`` on rank 0
(wall and thread time) with the number of records it took, and the calls rank 0 picked
in Python (the C dispatch serves the others), then the per-call cost of
held ``auto`` against the fixed algorithm. Writes bench/results/adapt-feed-cost-cpu.json
(or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch


def _rank(comm, nbytes: int, calls: int):
    import commlab
    from commlab.collectives import _adapt
    feeds = []
    feed, to_feed, fed = _adapt.feed, _adapt._to_feed, [0]

    def counted(c):
        recs = to_feed(c)
        fed[0] = len(recs)
        return recs

    def timed(c):
        fed[0], t, p = 0, time.perf_counter(), time.thread_time()
        feed(c)
        feeds.append((time.perf_counter() - t, time.thread_time() - p, fed[0]))

    _adapt._to_feed = counted
    nxt, picks = _adapt._next, [0]

    def picked(*a):  # a Python pick of an auto call (the C dispatch serves the others)
        picks[0] += 1
        return nxt(*a)

    _adapt._next = picked
    _adapt.feed = timed
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    for _ in range(150):  # past the key's learning periods
        commlab.all_reduce(x, algorithm="auto")
    commlab.synchronize()
    feeds.clear()
    picks[0] = 0
    t = time.perf_counter()
    for _ in range(calls):
        commlab.all_reduce(x, algorithm="auto")
    commlab.synchronize()
    auto = (time.perf_counter() - t) / calls
    python_picks = picks[0]
    held = _adapt._state(comm)[_adapt.key_for(comm, "all_reduce", x)].current
    t = time.perf_counter()
    for _ in range(calls):
        commlab.all_reduce(x, algorithm=held)
    commlab.synchronize()
    fixed = (time.perf_counter() - t) / calls
    return {"feeds": len(feeds), "feed_wall_us": [round(w * 1e6) for w, _, _ in feeds],
            "feed_cpu_us": [round(c * 1e6) for _, c, _ in feeds],
            "records_fed": [n for _, _, n in feeds], "python_picks": python_picks,
            "median_feed_us": statistics.median(w for w, _, _ in feeds) * 1e6 if feeds else 0,
            "held": held, "auto_us": auto * 1e6, "fixed_us": fixed * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=65536)
    ap.add_argument("--calls", type=int, default=1500)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"
                                         / "adapt-feed-cost-cpu.json"))
    a = ap.parse_args(argv)
    from commlab.testing import run_world

    r = run_world(_rank, a.ranks, args=(a.bytes, a.calls), backend="cpu",
                  env={"COMMLAB_ADAPT": "1", "COMMLAB_RECORDS": "1"})[0]
    r.update(ranks=a.ranks, bytes=a.bytes, calls=a.calls, commit=os.environ.get("COMMLAB_COMMIT"))
    print(f"{r['feeds']} feeds, median {r['median_feed_us']:.0f} us, {r['python_picks']} "
          f"Python picks; auto {r['auto_us']:.0f} us "
          f"a call against {r['held']} {r['fixed_us']:.0f} us")
    Path(a.out).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
