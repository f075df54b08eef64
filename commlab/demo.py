"""The demo: every collective on this world, checked against torch.distributed, timed.

    torchrun --nproc-per-node 4 -m commlab.demo            # CPU backend without a GPU
    torchrun --nproc-per-node 2 -m commlab.demo --size 64MiB   # on two GPUs

Rank 0 prints one line per collective: the algorithm, whether it matched
torch.distributed (gloo on CPU, NCCL on GPU), and the median time of a few calls.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import commlab
from commlab.runtime import parse_size


def _time(fn, comm, reps: int) -> float:
    times = []
    for _ in range(reps):
        comm.synchronize()
        t0 = time.perf_counter()
        fn()
        comm.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m commlab.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--size", default="256KiB", help="bytes per rank, e.g. 256KiB, 64MiB")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    comm = commlab.init(backend=args.backend)
    r, w = comm.rank, comm.world_size
    n = max(w, parse_size(args.size) // 4 // w * w)
    gen = torch.Generator().manual_seed(2026 + r)
    x = torch.randn(n, generator=gen).to(comm.device)
    ops = {
        "all_reduce one_shot": (lambda: commlab.all_reduce(x, algorithm="one_shot"), "sum"),
        "all_reduce two_shot": (lambda: commlab.all_reduce(x, algorithm="two_shot"), "sum"),
        "all_reduce ring": (lambda: commlab.all_reduce(x, algorithm="ring"), "sum"),
        "all_gather": (lambda: commlab.all_gather(x), "gather"),
        "reduce_scatter": (lambda: commlab.reduce_scatter(x), "rs"),
        "broadcast (src 0)": (lambda: commlab.broadcast(x, src=0), "bcast"),
        "all_to_all": (lambda: commlab.all_to_all(x), "a2a"),
    }
    if r == 0:
        print(f"commlab {commlab.__version__}: {w} ranks, backend {comm.backend}, "
              f"{n * 4 / 1024:.0f} KiB float32 per rank\n")
        print(f"{'collective':<22} {'matches torch.distributed':<27} {'median':>10}")
    for name, (fn, kind) in ops.items():
        got = fn()
        ref = _reference(kind, x, w, r)
        ok = torch.allclose(got, ref, rtol=1e-4, atol=1e-4)
        us = _time(fn, comm, args.reps)
        if r == 0:
            print(f"{name:<22} {'yes' if ok else 'NO':<27} {us / 1e3:>8.2f} ms")
    commlab.barrier()
    if r == 0:
        print("\nnext: notebooks/00-write-your-own-collective.ipynb, notebooks/01-quickstart.ipynb")
    commlab.finalize()


def _reference(kind: str, x: torch.Tensor, w: int, r: int) -> torch.Tensor:
    if kind == "sum":
        y = x.clone()
        dist.all_reduce(y)
        return y
    if kind == "gather":
        parts = [torch.empty_like(x) for _ in range(w)]
        dist.all_gather(parts, x)
        return torch.cat(parts)
    if kind == "rs":
        y = x.clone()
        dist.all_reduce(y)
        c = x.numel() // w
        return y[r * c:(r + 1) * c]
    if kind == "bcast":
        y = x.clone()
        dist.broadcast(y, 0)
        return y
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    return y


if __name__ == "__main__":
    main()
