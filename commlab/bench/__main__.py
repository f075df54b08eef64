"""``python -m commlab.bench`` under torchrun: verify, time, print, write records.

    torchrun --nproc-per-node 2 -m commlab.bench --mode both --out bench/results
    torchrun --nproc-per-node 4 -m commlab.bench --backend cpu --ops all_reduce --sizes 4MiB
"""

from __future__ import annotations

import argparse
import os
import sys

import commlab
from commlab import bench
from commlab.bench._records import OPS, size_range

# NVLink multicast stays off for everything this process starts (NCCL NVLS, PyTorch
# symmetric memory, NVSHMEM); main() sets them before the process group starts, which is
# when NCCL and symmetric memory read them.
SAFE_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
            "NVSHMEM_DISABLE_NVLS": "1"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m commlab.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"),
                   help="cpu on a machine with GPUs also needs COMMLAB_BACKEND=cpu in the "
                   "environment (the interpreter is chosen when commlab is imported)")
    p.add_argument("--ops", default=",".join(OPS), help="comma list (default: all five)")
    p.add_argument("--sizes", default=None, help="comma list of sizes, e.g. 8,64KiB,4MiB")
    p.add_argument("--min", default="8", help="smallest size when --sizes is not given")
    p.add_argument("--max", default="1GiB", help="largest size when --sizes is not given")
    p.add_argument("--factor", type=int, default=4, help="step between sizes (default 4)")
    p.add_argument("--dtype", default=None,
                   help="float32 | bfloat16 | float16 | int32 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--algorithms", default=None,
                   help="comma list of impl patterns: nccl, gloo, commlab:*, two_shot, "
                   "torch_symm_mem:*")
    p.add_argument("--mode", default="eager", choices=("eager", "graph", "both"))
    p.add_argument("--iters", type=int, default=30, help="timed repetitions up to 16 MiB "
                   "(fewer above, at least 5)")
    p.add_argument("--out", default="bench/results",
                   help="folder for <machine>-w<world>.json ('' to skip writing)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    for k, v in SAFE_ENV.items():
        os.environ[k] = v
    args = parse_args(argv)
    if args.backend == "cpu":
        os.environ.setdefault("COMMLAB_BACKEND", "cpu")
    sizes = ([bench.parse_size(s) for s in args.sizes.split(",")] if args.sizes
             else size_range(args.min, args.max, args.factor))
    modes = ("eager", "graph") if args.mode == "both" else (args.mode,)
    comm = commlab.init(backend=args.backend)
    result = bench.BenchResult()
    path = bench.results_path(args.out, comm) if args.out else None
    for op in [o.strip() for o in args.ops.split(",")]:  # written op by op: a run cut
        part = bench.run(comm, ops=[op], sizes=sizes,     # short keeps what it measured
                         dtype=args.dtype, modes=modes, iters=args.iters,
                         algorithms=args.algorithms.split(",") if args.algorithms else None,
                         progress=not args.no_progress)
        result.records += part.records
        result.failures += part.failures
        result.skipped += part.skipped
        if comm.rank == 0 and path and part.records:
            bench.write_records(path, part.records)
    if comm.rank == 0:
        print(bench.format_table(result.records, bench.link_peak_gbps(comm)))
        _print_ratios(result.records)
        for s in result.skipped:
            print(f"skipped: {s}")
        for f in result.failures:
            print(f"FAILED verification: {f}", file=sys.stderr)
        if path and result.records:
            print(f"wrote {len(result.records)} records to {path}")
    commlab.finalize()
    return 1 if result.failures else 0


def _print_ratios(records) -> None:
    """time / baseline time for every commlab and torch impl (the number people ask)."""
    base = {(r.op, r.dtype, r.bytes, r.mode): r.time_us for r in records
            if r.impl in ("nccl", "gloo")}
    lines = []
    for r in records:
        b = base.get((r.op, r.dtype, r.bytes, r.mode))
        if b and r.impl not in ("nccl", "gloo"):
            lines.append(f"  {r.op} {r.mode} {r.bytes} B {r.impl}: {r.time_us / b:.2f}x baseline")
    if lines:
        print("time relative to the torch.distributed baseline (lower is faster):")
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
