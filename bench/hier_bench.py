"""The hierarchical all_reduce on 2 simulated hosts x 2 ranks against flat gloo, in the
same world (CPU backend; needs root for the namespaces, ``tests/_hosts.py``).

    sudo .venv/bin/python bench/hier_bench.py                  # writes the files below
    .venv/bin/python bench/hier_bench.py --sizes 4KiB 64KiB --reps 5

Each size: the result is checked against gloo first, then each impl runs ``--reps``
times, every call started after a gloo barrier; the time of a call is the slowest
rank's, the record keeps the median. ``commlab:hier`` is ``commlab.all_reduce`` in a
world across hosts (commlab's kernels in Triton's interpreter inside each host, gloo
between hosts); ``gloo`` is ``dist.all_reduce`` on the flat world. busbw = algbw·2(n-1)/n
(n = 4). Writes ``bench/results/hier-cpu-2x2.json`` (DESIGN.md's records) and
``hier-cpu-2x2.svg``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB", "16MiB")
OUT = ROOT / "bench" / "results" / "hier-cpu-2x2"


def _worker(out_dir: str, sizes: list[int], reps: int) -> None:
    import torch
    import torch.distributed as dist

    import commlab

    comm = commlab.init()
    records = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(comm.rank))
        ref = x.clone()
        dist.all_reduce(ref)
        torch.testing.assert_close(commlab.all_reduce(x), ref, rtol=1e-5, atol=1e-4)
        impls = {"commlab:hier": lambda x=x: commlab.all_reduce(x),
                 "gloo": lambda x=x: dist.all_reduce(x.clone())}
        for impl, fn in impls.items():
            fn()  # warm-up
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                t = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times.append(t.item() * 1e6)
            records.append({"impl": impl, "bytes": nbytes, "time_us": statistics.median(times)})
    if comm.rank == 0:
        Path(out_dir, "records.json").write_text(json.dumps(records))
    commlab.finalize()


def _svg(records: list[dict]) -> str:
    """time_us against bytes, log-log, one line per impl."""
    import math

    w, h, pad = 560, 340, 60
    xs = sorted({r["bytes"] for r in records})
    ys = [r["time_us"] for r in records]
    lx0, lx1 = math.log2(xs[0]), math.log2(xs[-1])
    ly0, ly1 = math.log10(min(ys)) - 0.1, math.log10(max(ys)) + 0.1

    def px(b):
        return pad + (math.log2(b) - lx0) / (lx1 - lx0 or 1) * (w - 2 * pad)

    def py(t):
        return h - pad - (math.log10(t) - ly0) / (ly1 - ly0) * (h - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="18" text-anchor="middle">all_reduce fp32, 2 simulated '
             f'hosts x 2 ranks (CPU): median µs per call</text>']
    for b in xs:
        label = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        parts.append(f'<text x="{px(b):.0f}" y="{h - pad + 16}" text-anchor="middle">'
                     f'{label}</text>')
    for e in range(math.ceil(ly0), math.floor(ly1) + 1):
        parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{py(10 ** e):.0f}" '
                     f'y2="{py(10 ** e):.0f}" stroke="#ddd"/><text x="{pad - 6}" '
                     f'y="{py(10 ** e) + 4:.0f}" text-anchor="end">{10 ** e:g}</text>')
    for i, (impl, color) in enumerate((("commlab:hier", "#c0392b"), ("gloo", "#2c3e50"))):
        pts = sorted((r["bytes"], r["time_us"]) for r in records if r["impl"] == impl)
        path = " ".join(f"{px(b):.1f},{py(t):.1f}" for b, t in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                     f'stroke-width="2"/><text x="{w - pad - 90}" y="{pad + 14 * i}" '
                     f'fill="{color}">{impl}</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from commlab.bench import git_commit, parse_size

    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        return _worker(args.worker, sizes, args.reps)
    from bench._hosts_world import run_on_two_hosts
    from commlab.bench._records import Record

    raw = run_on_two_hosts(__file__, ["--reps", str(args.reps), "--sizes", *args.sizes])
    commit = git_commit(ROOT)
    device = f"cpu ({os.cpu_count()} cores), 2 simulated hosts x 2 ranks, gloo over veth"
    records = [Record.measured(op="all_reduce", impl=r["impl"], dtype="float32",
                               nbytes=r["bytes"], world_size=4, time_us=r["time_us"],
                               device=device, commit=commit, mode="eager").__dict__
               for r in raw]
    OUT.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    OUT.with_suffix(".svg").write_text(_svg(raw))
    print(f"{'bytes':>10} {'impl':<14} {'median µs':>10} {'busbw GB/s':>11}")
    for r in records:
        print(f"{r['bytes']:>10} {r['impl']:<14} {r['time_us']:>10.0f} {r['busbw_gbps']:>11.3f}")


if __name__ == "__main__":
    main()
