"""CPU backend, 2 ranks: per-call time of a 64K-element fp32 all_reduce (median, p90), the
figure the blocked-wait registry (``commlab._interpreter.blocked``) must not move.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 .venv/bin/python bench/checks/cpu_wait_registry_cost.py

``PYTHONPATH=<an older checkout>`` measures that one (before/after comparisons).
"""

from __future__ import annotations

import statistics
import time

import torch

CALLS = 60
N = 64 * 1024


def _world(comm) -> tuple[float, float]:
    import torch.distributed as dist

    import commlab

    x = torch.ones(N)
    for _ in range(5):
        commlab.all_reduce(x)
    dist.barrier()
    ts = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        commlab.all_reduce(x)
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return statistics.median(ts), ts[int(0.9 * len(ts))]


def main() -> None:
    import commlab
    from commlab.testing import run_world

    res = run_world(_world, 2, timeout=600)
    med, p90 = max(r[0] for r in res), max(r[1] for r in res)
    print(f"{commlab.__file__}: all_reduce {N} fp32, 2 ranks: median {med:.2f} ms, "
          f"p90 {p90:.2f} ms per call")


if __name__ == "__main__":
    main()
