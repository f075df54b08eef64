"""What the CPU per-call benchmarks share (``cpu_eager_bench``, ``torch_backend_overhead``):
their command line, a timed round of back-to-back calls, the slowest rank's value, a
cProfile as text."""

from __future__ import annotations

import argparse
import io
import pstats
import time

import torch
import torch.distributed as dist


def round_us(fn, iters: int, group) -> float:
    """Microseconds per call of ``iters`` back-to-back ``fn()`` calls, started together
    (a barrier on ``group``, a gloo group: it is not what is timed)."""
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def slowest(value: float, group) -> float:
    """The largest ``value`` over the ranks of ``group`` (a world's time is its slowest
    rank's)."""
    worst = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst)


def profile_text(prof, heading: str, sorts: tuple[tuple[str, int], ...]) -> list[str]:
    """``prof`` (a cProfile.Profile) as one section per ``(sort key, rows)``."""
    out = []
    for key, top in sorts:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).strip_dirs().sort_stats(key).print_stats(top)
        out.append(f"## {heading}, by {key}\n" + s.getvalue())
    return out


def parser(doc: str, world: int, iters: int, reps: int, profile: str) -> argparse.ArgumentParser:
    """The options every CPU per-call benchmark takes (``profile``: where ``--profile TAG``
    writes rank 0's cProfile); a benchmark adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--world", type=int, default=world)
    p.add_argument("--iters", type=int, default=iters, help="back-to-back calls per round")
    p.add_argument("--reps", type=int, default=reps, help="rounds per impl (interleaved)")
    p.add_argument("--profile", default=None, metavar="TAG",
                   help=f"also write rank 0's cProfile to {profile}")
    p.add_argument("--out", default=None, help="records file (JSON list)")
    return p
