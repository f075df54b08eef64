"""Eager per-call time of the CPU backend, side by side with gloo and the torch backend.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 .venv/bin/python bench/cpu_eager_bench.py

Spawns ``--world`` CPU ranks (4). For every op and size, ``commlab:auto`` (the public
collective), ``torch-backend:commlab`` (torch.distributed on the "commlab" backend) and
``gloo`` are first checked against gloo on fresh random data, then timed interleaved:
``--reps`` rounds, each running every impl for ``--iters`` back-to-back calls; an impl's
time is the median round of the slowest rank. Records (``mode`` "eager") go to
``bench/results/cpu-eager-w<W>.json``; ``--profile TAG`` also writes rank 0's cProfile of
all_reduce at 1M fp32 and at 256 KiB to ``bench/results/cpu-eager-profile-TAG.txt``.
The goal (issue 29): all_reduce 1M fp32 at most 3x gloo, a 256 KiB collective at most
10 ms, the torch backend at most 1.1x the direct call.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
# (op, total bytes as nccl-tests counts them: all_gather's output, the others' input)
CASES = (("all_reduce", 256 << 10), ("all_reduce", 4 << 20), ("all_gather", 256 << 10),
         ("reduce_scatter", 256 << 10), ("broadcast", 256 << 10), ("all_to_all", 256 << 10))
IMPLS = ("commlab:auto", "torch-backend:commlab", "gloo")


def _calls(op: str, nbytes: int, world: int, rank: int, groups: dict, gen):
    """impl -> (check(): its output on fresh data, timed(): one call), and gloo's answer."""
    import commlab

    n = nbytes // 4
    x = torch.randn(n // world if op == "all_gather" else n, generator=gen)
    part = n // world
    t = torch.zeros_like(x)

    def dist_call(group, inp):
        if op == "all_reduce":
            y = inp.clone()
            dist.all_reduce(y, group=group)
        elif op == "broadcast":
            y = inp.clone()
            dist.broadcast(y, src=0, group=group)
        elif op == "all_gather":
            y = inp.new_empty(inp.numel() * world)
            dist.all_gather_into_tensor(y, inp, group=group)
        elif op == "reduce_scatter":
            y = inp.new_empty(part)
            if group is groups["gloo"]:  # gloo has no reduce_scatter_tensor
                y = inp.clone()
                dist.all_reduce(y, group=group)
                y = y[rank * part:(rank + 1) * part].clone()
            else:
                dist.reduce_scatter_tensor(y, inp, group=group)
        else:
            y = torch.empty_like(inp)
            dist.all_to_all_single(y, inp, group=group)
        return y

    direct = getattr(commlab, op)
    out = {
        "commlab:auto": (lambda: direct(x), lambda: direct(t)),
        "torch-backend:commlab": (lambda: dist_call(groups["commlab"], x),
                                  lambda: dist_call(groups["commlab"], t)),
        "gloo": (lambda: dist_call(groups["gloo"], x), lambda: dist_call(groups["gloo"], t)),
    }
    return out


def _round_us(fn, iters: int, gloo) -> float:
    dist.barrier(group=gloo)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def _profile(comm, rank: int) -> str:
    import commlab

    text = []
    for n in (1 << 20, 65536):
        x = torch.randn(n)
        for _ in range(3):
            commlab.all_reduce(x)
        comm.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            commlab.all_reduce(x)
        comm.synchronize()
        prof.disable()
        for key, top in (("cumulative", 45), ("tottime", 25)):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).strip_dirs().sort_stats(key).print_stats(top)
            text.append(f"## rank {rank}: all_reduce {n} fp32 ({n * 4} B), 5 calls, by {key}\n"
                        + s.getvalue())
    return "\n".join(text)


def bench(comm, iters: int, reps: int, profile: bool) -> dict:
    import commlab
    from commlab.bench._records import Record, git_commit

    dist.init_process_group("commlab")
    groups = {"commlab": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    comm = commlab.init()
    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(1234 + rank)
    device, commit = f"cpu ({os.cpu_count()} cores)", git_commit(ROOT)
    records = []
    bar = None
    if rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=len(CASES) * len(IMPLS) * (reps + 1), desc="cpu eager", unit="step")
    for op, nbytes in CASES:
        calls = _calls(op, nbytes, world, rank, groups, gen)
        want = calls["gloo"][0]()
        for impl in IMPLS:  # check every impl on the same fresh data before timing
            torch.testing.assert_close(calls[impl][0](), want, rtol=1e-5, atol=1e-5 * world,
                                       msg=lambda m, impl=impl: f"{op} {impl}: {m}")
            if bar is not None:
                bar.update()
        times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
        for _ in range(reps):
            for impl in IMPLS:
                times[impl].append(_round_us(calls[impl][1], iters, groups["gloo"]))
                if bar is not None:
                    bar.update()
        comm.synchronize()
        for impl in IMPLS:
            worst = torch.tensor([statistics.median(times[impl])], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=groups["gloo"])
            records.append(Record.measured(op=op, impl=impl, dtype="float32", nbytes=nbytes,
                                           world_size=world, time_us=float(worst),
                                           device=device, commit=commit, mode="eager"))
    if bar is not None:
        bar.close()
    prof = _profile(comm, rank) if profile else ""
    dist.barrier(group=groups["gloo"])
    dist.destroy_process_group()
    return {"records": [r.__dict__ for r in records], "profile": prof} if rank == 0 else {}


def table(records: list[dict]) -> str:
    lines = [f"{'op':<15}{'bytes':>9}  {'impl':<22}{'ms':>9}  {'x gloo':>7}"]
    gloo = {(r["op"], r["bytes"]): r["time_us"] for r in records if r["impl"] == "gloo"}
    for r in records:
        ratio = r["time_us"] / gloo[(r["op"], r["bytes"])]
        lines.append(f"{r['op']:<15}{r['bytes']:>9}  {r['impl']:<22}"
                     f"{r['time_us'] / 1e3:>9.2f}  {ratio:>7.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--iters", type=int, default=5, help="back-to-back calls per round")
    p.add_argument("--reps", type=int, default=7, help="rounds per impl (interleaved)")
    p.add_argument("--profile", default=None, metavar="TAG",
                   help="also write rank 0's cProfile to cpu-eager-profile-TAG.txt")
    p.add_argument("--out", default=None, help="records file (JSON list)")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from commlab.testing import run_world

    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
    got = run_world(bench, a.world, args=(a.iters, a.reps, a.profile is not None),
                    init=False, timeout=1800, env=env)[0]
    records = got["records"]
    print(table(records))
    results = ROOT / "bench" / "results"
    out = Path(a.out) if a.out else results / f"cpu-eager-w{a.world}.json"
    out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {out}")
    if a.profile:
        prof = results / f"cpu-eager-profile-{a.profile}.txt"
        prof.write_text(f"# bench/cpu_eager_bench.py --profile {a.profile}, commit "
                        f"{records[0]['commit']}, {a.world} ranks\n\n{got['profile']}")
        print(f"wrote {prof}")


if __name__ == "__main__":
    main()
