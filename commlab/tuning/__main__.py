"""``python -m commlab.tuning`` under torchrun: build this topology's tuning table, then
check that ``auto`` is within 5% of the best single algorithm at every swept size.

    torchrun --nproc-per-node 2 -m commlab.tuning --check --out bench/results
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    from commlab.bench.__main__ import SAFE_ENV

    os.environ.update(SAFE_ENV)
    p = argparse.ArgumentParser(prog="python -m commlab.tuning", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--ops", default="all_reduce,all_gather,all_to_all,broadcast",
                   help="comma list of ops with a choice of algorithms")
    p.add_argument("--sizes", default=None, help="comma list (default: tuning's defaults)")
    p.add_argument("--dtypes", default=None, help="comma list (default: bf16,fp32 GPU; fp32 CPU)")
    p.add_argument("--mode", default=None, choices=("eager", "graph"))
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--check", action="store_true",
                   help="after tuning, time auto against each algorithm (fresh run)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--rounds", type=int, default=3,
                   help="check: time every algorithm this many times, interleaved, and "
                        "compare the medians (a 5 µs call varies by ~1 µs run to run)")
    p.add_argument("--out", default="", help="merge the check's records into this folder")
    args = p.parse_args(argv)
    if args.backend == "cpu":
        os.environ.setdefault("COMMLAB_BACKEND", "cpu")
    from commlab import bench, tuning
    from commlab.runtime import finalize, init

    comm = init(backend=args.backend)
    sizes = [bench.parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
    dtypes = args.dtypes.split(",") if args.dtypes else None
    ops = [o for o in args.ops.split(",") if o]
    table = tuning.tune(ops=ops, sizes=sizes, dtypes=dtypes, mode=args.mode, iters=args.iters)
    rc = 0
    if comm.rank == 0:
        print(f"tuning table {table.fingerprint} -> {tuning.table_path(comm)}")
        for key, rows in table.entries.items():
            print(f"  {key}: " + ", ".join(f"{r['bytes']} B {r['algorithm']}" for r in rows))
    if args.check:
        mode = table.meta.get("mode", "eager")
        rounds = []
        for _ in range(max(1, args.rounds)):
            records = []
            for dt in dtypes or sorted({k.split("|")[1] for k in table.entries}):
                res = bench.run(comm, ops=ops, sizes=sizes or tuning.default_sizes(
                    comm.backend), dtype=dt, modes=(mode,), iters=args.iters or 20,
                    algorithms=["commlab:*"])
                records += res.records
            rounds.append(records)
        records = median_records(rounds)
        if comm.rank == 0:
            bad = tuning.auto_violations(
                records, args.tolerance,
                choice=lambda op, dt, nb: table.choose(op, dt, comm.world_size, nb))
            print(bench.format_table(records, bench.link_peak_gbps(comm)))
            print(f"auto vs best single algorithm: {len(bad)} size(s) more than "
                  f"{100 * args.tolerance:g}% slower" + (":" if bad else ""))
            for line in bad:
                print(f"  {line}")
            rc = 1 if bad else 0
            if args.out and records:
                path = bench.write_records(bench.results_path(args.out, comm), records)
                print(f"wrote to {path}")
    finalize()
    return rc


def median_records(rounds: list[list]) -> list:
    """One record per (op, impl, dtype, mode, bytes): the one with the median time over
    the rounds (each round timed every implementation once, so they share the noise)."""
    groups: dict[tuple, list] = {}
    for records in rounds:
        for r in records:
            groups.setdefault((r.op, r.impl, r.dtype, r.mode, r.bytes), []).append(r)
    return [sorted(g, key=lambda r: r.time_us)[(len(g) - 1) // 2] for g in groups.values()]


if __name__ == "__main__":
    sys.exit(main())
