"""Cost of commlab.racecheck on the CPU backend: each collective at 64K fp32 elements on
2 ranks, median of repeated calls, unchecked and under racecheck (the ratio is the
slowdown; the aim is under 10x). Off, racecheck costs one None check per memory access.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 .venv/bin/python bench/probes/racecheck_cost.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from commlab.testing import run_world  # noqa: E402

N, REPEATS = 64 * 1024, 5


def _time(fn, x):
    out = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def cost_world(comm):
    import torch

    import commlab

    world = comm.world_size
    ops = {"all_reduce": lambda x: commlab.all_reduce(x),
           "all_gather": lambda x: commlab.all_gather(x[: N // world]),
           "reduce_scatter": lambda x: commlab.reduce_scatter(x),
           "broadcast": lambda x: commlab.broadcast(x, 0),
           "all_to_all": lambda x: commlab.all_to_all(x)}
    x = torch.randn(N)
    res = {}
    for name, fn in ops.items():
        fn(x)  # warm
        off = _time(fn, x)
        with commlab.racecheck():
            fn(x)
            on = _time(fn, x)
        res[name] = (off, on)
    return res


if __name__ == "__main__":
    res = run_world(cost_world, 2, timeout=900)[0]
    print(f"{'collective':16} {'off ms':>9} {'racecheck ms':>13} {'ratio':>6}")
    for name, (off, on) in res.items():
        print(f"{name:16} {off * 1e3:9.2f} {on * 1e3:13.2f} {on / off:6.2f}")
