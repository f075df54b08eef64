"""Rank function for tests/test_cell_outcome.py: random "cells" of cached calls,
mismatches and local errors on different ranks, each cell ended as a %%distributed cell
ends (``commlab.engine._cell.finish``); every rank reports each cell's outcome."""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

import commlab
from commlab.engine import _cell


def make_sequences(seed: int, count: int, world: int) -> list[list[list[tuple]]]:
    """``count`` sequences of 3-5 cells. A step is ("call", sizes per rank) or ("raise",
    ranks). Calls mostly repeat the previous size (cached plans: ranks run ahead); a
    cell's last call may mismatch (one or two ranks pass another size), optionally
    followed by a call every rank changes to (ranks that ran ahead raise there); a cell
    may end with a local error on some ranks. Nothing after a mismatch repeats its call:
    a rank that ran ahead would launch a kernel no peer meets (a real hang)."""
    rng = random.Random(seed)
    seqs, size = [], 4
    for _ in range(count):
        cells = []
        for _ in range(rng.randint(3, 5)):
            steps: list[tuple] = []
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.25:
                    size = rng.choice((4, 5))
                steps.append(("call", [size] * world))
            if rng.random() < 0.5:
                odd = rng.sample(range(world), rng.choice((1, 1, 2)))
                sizes = [size] * world
                for i, r in enumerate(odd):
                    sizes[r] = 6 + i
                steps.append(("call", sizes))
                if rng.random() < 0.4:
                    steps.append(("call", [8] * world))
            if rng.random() < 0.4:
                steps.append(("raise", sorted(rng.sample(range(world), rng.randint(1, 2)))))
            cells.append(steps)
        seqs.append(cells)
    return seqs


def expected(cell: list[tuple]) -> str:
    """What every rank's outcome of ``cell`` must be (the rank decides "raise" ones)."""
    for kind, arg in cell:
        if kind == "call" and len(set(arg)) > 1:
            return "RankMismatchError"
    return "ok"


def cell_outcome_world(comm, seed: int, count: int) -> dict:
    rank, world = comm.rank, comm.world_size
    outcomes, bad_values, ahead_mismatches, ahead_calls = [], [], 0, 0
    for s, cells in enumerate(make_sequences(seed, count, world)):
        for c, steps in enumerate(cells):
            error: BaseException | None = None
            try:
                for i, (kind, arg) in enumerate(steps):
                    if kind == "raise":
                        if rank in arg:
                            1 / 0  # noqa: B018 (the user's local error)
                        continue
                    value = float(100 * i + rank + 1)
                    waits = comm.control.waits
                    try:
                        out = commlab.all_reduce(torch.full((arg[rank],), value))
                    finally:
                        ran_ahead = comm.control.waits == waits
                        ahead_calls += ran_ahead
                        ahead_mismatches += ran_ahead and len(set(arg)) > 1
                    want = sum(100 * i + r + 1 for r in range(world))
                    if len(set(arg)) == 1 and not torch.equal(out, torch.full_like(out, want)):
                        bad_values.append((s, c, i, out.tolist()))
            except Exception as e:
                error = e
            final = _cell.finish(error)
            outcomes.append((s, c, type(final).__name__ if final else "ok",
                             str(final) if final else ""))
    every: list = [None] * world
    dist.all_gather_object(every, outcomes)
    return {"outcomes": outcomes, "every": every, "bad_values": bad_values,
            "ahead_calls": ahead_calls, "ahead_mismatches": ahead_mismatches}
