"""How fast is the notebook engine? Start-up of a 4-rank CPU world and the round trip
of a trivial cell, side by side with ipyparallel's own ``%%px`` in the same run.

    python bench/probes/engine_startup.py [--ranks 4] [--starts 3] [--cells 60]

Writes bench/results/engine-cpu.json and prints a table. The target: a ``%%distributed``
round trip within 1.5x of ``%%px`` (both go through the same zmq controller; ours adds
output grouping and per-rank hang/death watching).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
    return {"median_ms": statistics.median(xs) * 1e3, "p10_ms": q(0.1) * 1e3,
            "p90_ms": q(0.9) * 1e3, "n": len(xs)}


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "commlab")
    return ip


def _time_cells(run, n: int, desc: str) -> list[float]:
    for _ in range(5):  # warm-up
        run()
    out = []
    for _ in tqdm(range(n), desc=desc, leave=False):
        t0 = time.perf_counter()
        run()
        out.append(time.perf_counter() - t0)
    return out


def bench_ipp(ranks: int, starts: int, cells: int, ip) -> tuple[list, list]:
    import ipyparallel as ipp
    from IPython.utils.capture import capture_output

    start_t, cell_t = [], []
    for i in range(starts):
        t0 = time.perf_counter()
        cluster = ipp.Cluster(n=ranks, controller_ip="127.0.0.1", log_level=logging.WARNING)
        rc = cluster.start_and_connect_sync()
        rc.wait_for_engines(ranks, timeout=120, interactive=False)
        start_t.append(time.perf_counter() - t0)
        if i == 0:
            rc[:].activate()

            def run():
                with capture_output():
                    ip.run_cell_magic("px", "--block", "pass")  # wait, as %%distributed does

            cell_t = _time_cells(run, cells, "%%px")
        cluster.stop_cluster_sync()
    return start_t, cell_t


def bench_commlab(ranks: int, starts: int, cells: int, ip) -> tuple[list, list]:
    from IPython.utils.capture import capture_output

    from commlab.engine import current_world, start_world

    start_t, cell_t = [], []
    for i in range(starts):
        t0 = time.perf_counter()
        start_world(ranks, backend="cpu")
        start_t.append(time.perf_counter() - t0)
        if i == 0:
            def run():
                with capture_output():
                    ip.run_cell_magic("distributed", "", "pass")

            cell_t = _time_cells(run, cells, "%%distributed")
        current_world().stop()
    return start_t, cell_t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--starts", type=int, default=3, help="world start-ups to time")
    ap.add_argument("--cells", type=int, default=60, help="trivial cells to time")
    ap.add_argument("--out", default=str(ROOT / "bench/results/engine-cpu.json"))
    args = ap.parse_args()
    os.environ.setdefault("COMMLAB_BACKEND", "cpu")
    ip = _shell()
    ipp_start, ipp_cell = bench_ipp(args.ranks, args.starts, args.cells, ip)
    cl_start, cl_cell = bench_commlab(args.ranks, args.starts, args.cells, ip)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    common = {"world_size": args.ranks, "device": f"cpu x{os.cpu_count()}", "commit": commit,
              "python": sys.version.split()[0]}
    records = [
        {"metric": "startup", "impl": "ipyparallel", **_stats(ipp_start), **common},
        {"metric": "startup", "impl": "commlab", **_stats(cl_start), **common,
         "note": "includes import torch/triton and commlab.init() on every rank"},
        {"metric": "cell_round_trip", "impl": "ipyparallel:%%px", **_stats(ipp_cell), **common},
        {"metric": "cell_round_trip", "impl": "commlab:%%distributed", **_stats(cl_cell),
         **common},
    ]
    ratio = records[3]["median_ms"] / records[2]["median_ms"]
    records[3]["ratio_to_px"] = ratio
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    print(f"\n{'metric':<18}{'impl':<24}{'median ms':>11}{'p10':>9}{'p90':>9}{'n':>5}")
    for r in records:
        print(f"{r['metric']:<18}{r['impl']:<24}{r['median_ms']:>11.1f}{r['p10_ms']:>9.1f}"
              f"{r['p90_ms']:>9.1f}{r['n']:>5}")
    verdict = "within" if ratio <= 1.5 else "OVER"
    print(f"\n%%distributed / %%px round trip = {ratio:.2f}x ({verdict} the 1.5x target); "
          f"{args.ranks} ranks, {os.cpu_count()} cores; written to {args.out}")


if __name__ == "__main__":
    main()
