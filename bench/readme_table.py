"""Print the README's results table from a records file (so the table is never typed).

    python bench/readme_table.py bench/results/2xh200-w2.json [--sizes 8,64KiB,1MiB,256MiB,1GiB]
    python bench/readme_table.py --overlap bench/results/overlap-2xh200-w2.json

One row per (op, size, mode), bf16: commlab's ``auto`` (with the fastest single commlab
algorithm at that point in parentheses; the fastest one's time when there is no auto
record), NCCL, the best PyTorch symmetric-memory op, and busbw. Sizes are total bytes as recorded.
With --overlap: one row per (op, model, M) of commlab.bench.overlap's records, every impl
and the hidden share, (NCCL + matmul - fused) / comm alone.
"""

from __future__ import annotations

import argparse
import json

from commlab.bench import fmt_bytes, parse_size

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def fmt(t: float | None) -> str:
    return "—" if t is None else (f"{t:.1f}" if t < 10000 else f"{t:.0f}")


OVERLAP_IMPLS = ("sequential", "commlab:sequential", "commlab:fused", "commlab:auto",
                 "torch_symm_mem:fused", "comm_only", "gemm_only", "triton_gemm_only")


def overlap_table(path: str) -> None:
    t = {(r["op"], r["model"], r["m"], r["impl"]): r["time_us"] for r in json.load(open(path))
         if "tile" not in r}
    print("| op | Llama-3 | M | NCCL + matmul | commlab collective + matmul | commlab fused "
          "| commlab auto | torch fused | comm alone | cuBLAS alone | Triton GEMM alone "
          "| hidden |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for op, model, m in sorted({k[:3] for k in t}, key=lambda k: (k[0], int(k[1][7:-1]), k[2])):
        v = [t.get((op, model, m, i)) for i in OVERLAP_IMPLS]
        hidden = (v[0] - v[2]) / v[5]
        print(f"| {op} | {model.removeprefix('llama3-')} | {m} | "
              + " | ".join(fmt(x) for x in v) + f" | {hidden:.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--sizes", default="8,64KiB,1MiB,256MiB,1GiB")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--overlap", action="store_true",
                    help="the records are commlab.bench.overlap's (ag_gemm / gemm_rs)")
    args = ap.parse_args()
    if args.overlap:
        return overlap_table(args.records)
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
