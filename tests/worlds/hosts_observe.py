"""Rank function for tests/test_hosts_observe.py: observe a world of 2 hosts x 2 ranks
through public names only (``commlab.topology.of_world``, ``commlab.topology.linkbench.run``,
``commlab.costmodel.measure_levels``).

``python -m tests.worlds.hosts_observe OUT_DIR`` under torchrun: each rank writes
OUT_DIR/rank<N>.json with what it got.
"""

from __future__ import annotations

import os
import sys
import time

import commlab
from commlab import costmodel, topology


def observe(comm) -> dict:
    out: dict = {"rank": comm.rank, "hostname": os.uname().nodename, "seconds": {}}
    t = time.perf_counter()
    out["topology"] = topology.of_world(comm).to_dict()
    out["seconds"]["of_world"] = time.perf_counter() - t
    t = time.perf_counter()
    res = topology.linkbench.run(comm, sizes=(4 << 10, 64 << 10), iters=2)
    out["linkbench"] = res.to_dict()
    out["cross_host"] = res.cross_host
    out["seconds"]["linkbench"] = time.perf_counter() - t
    t = time.perf_counter()
    # median of 7: with 3, one CI run measured the 4 KiB hierarchical call 3x its projection
    out["levels"] = costmodel.measure_levels(comm, reps=7)
    out["seconds"]["levels"] = time.perf_counter() - t
    return out


def main(out_dir: str) -> None:
    from tests.worlds.hosts import save_and_finish

    comm = commlab.init()
    save_and_finish(comm, out_dir, observe(comm))


if __name__ == "__main__":
    main(sys.argv[1])
