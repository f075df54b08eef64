"""Print the README's results table from a records file (so the table is never typed).

    python bench/readme_table.py bench/results/2xh200-w2.json [--sizes 8,64KiB,1MiB,256MiB,1GiB]

One row per (op, size, mode), bf16: commlab's ``auto`` (with the fastest single commlab
algorithm at that point in parentheses; the fastest one's time when there is no auto
record), NCCL, the best PyTorch symmetric-memory op, and busbw. Sizes are total bytes as recorded.
"""

from __future__ import annotations

import argparse
import json

from commlab.bench import parse_size
from commlab.bench._records import fmt_bytes

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def fmt(t: float | None) -> str:
    return "—" if t is None else (f"{t:.1f}" if t < 10000 else f"{t:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--sizes", default="8,64KiB,1MiB,256MiB,1GiB")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    recs = [r for r in json.load(open(args.records)) if r["dtype"] == args.dtype]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print("| op | size | mode | commlab auto µs (fastest algorithm) | NCCL µs | torch symm-mem µs "
          "| commlab busbw GB/s | NCCL busbw |")
    print("|---|---|---|---|---|---|---|---|")
    for op in OPS:
        for size in sizes:
            for mode in ("graph", "eager"):
                rs = [r for r in recs if r["op"] == op and r["bytes"] == size
                      and r["mode"] == mode]
                by = {r["impl"]: r for r in rs}
                singles = {k: r for k, r in by.items()
                           if k.startswith("commlab:") and k != "commlab:auto"}
                if not singles:
                    continue
                fastest = min(singles, key=lambda k: singles[k]["time_us"])
                auto = by.get("commlab:auto") or singles[fastest]  # no auto record: fastest
                ran = fastest[8:]
                nccl = by.get("nccl")
                symm = [r for k, r in by.items() if k.startswith("torch_symm_mem:")]
                best_symm = min((r["time_us"] for r in symm), default=None)
                label = fmt_bytes(size)
                print(f"| {op} | {label} | {mode} | {fmt(auto['time_us'])} ({ran}) | "
                      f"{fmt(nccl and nccl['time_us'])} | {fmt(best_symm)} | "
                      f"{auto['busbw_gbps']:.0f} | "
                      f"{'—' if nccl is None else round(nccl['busbw_gbps'])} |")


if __name__ == "__main__":
    main()
