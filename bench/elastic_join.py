"""A newcomer joining a running world of CPU ranks: join time and bytes moved.

Each run starts a world of ``--ranks`` CPU ranks (its store served by this process, as
torchrun's agent serves it) and one newcomer; the members hold a symmetric tensor and a
``commlab.elastic.State`` (step counter, the tensor) and call ``commlab.grow(1)``; the
newcomer calls ``commlab.init(join=True)``, receives the state over commlab's broadcast
and runs checked collectives. Per run: ``join`` = the newcomer's ``init(join=True)``
returning, ``first_collective`` = its first correct collectives done (both from the call
to ``init``), ``grow`` = the slowest member's ``commlab.grow``, ``bytes`` = the state
sent to the newcomer. Goal (issue 27): a newcomer training within 3 s.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 python bench/elastic_join.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.elastic_recovery import _summary  # noqa: E402
from commlab.testing import run_world  # noqa: E402
from tests.worlds.elastic_grow import grow_member, newcomer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", default="bench/results/elastic-join-cpu.json")
    args = ap.parse_args()
    joins, firsts, grows, sent = [], [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            res = run_world(grow_member, args.ranks - 1, kwargs={"note_dir": d},
                            store="parent", timeout=180,
                            env={"COMMLAB_TIMEOUT": "60", "COMMLAB_PEER_TIMEOUT": "1"},
                            newcomers=[(newcomer, {"note_dir": d})])
        new = res[-1]
        assert all(r["y_ok"] and r["z_ok"] and r["g_ok"] for r in res), res
        joins.append(new["join_s"])
        firsts.append(new["first_collective_s"])
        grows.append(max(r["grow_s"] for r in res[:-1]))
        sent.append(new["received"])
        print(f"join {new['join_s']:.3f} s, first collective {new['first_collective_s']:.3f}"
              f" s, grow {grows[-1]:.3f} s, state {new['received']} B", flush=True)
    note = (f"{args.ranks - 1} members grow to {args.ranks}; the newcomer waits at the store "
            f"before the members call grow, so join includes the members' grow; 2-core "
            f"machine shared with other jobs: noisy, medians")
    out = [_summary("join", args.ranks, joins, note),
           _summary("first_collective", args.ranks, firsts, note),
           _summary("grow", args.ranks, grows, note)]
    for rec in out:
        rec["impl"] = "commlab:grow"
        rec["state_bytes"] = sent[0]
        rec["state_bytes_moved"] = sent[0] * (args.ranks - 1)  # broadcast to every other rank
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
