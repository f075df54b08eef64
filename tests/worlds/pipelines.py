"""Rank function: the pipelined push kernels with many programs and forced rounds.

On the CPU backend collectives normally run one program and one round; here every
kernel gets 3 programs of 64-element blocks and COMMLAB_ROUNDS (set by the test), so
the slice bookkeeping, both signal banks and the epoch counters across programs are
exercised as they are on GPUs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import commlab
from commlab.collectives import (
    _common,
    all_gather,
    all_to_all,
    broadcast,
    one_shot_all_reduce,
    reduce_scatter,
    two_shot_all_reduce,
)


def _small_launch(comm, n):
    return _common.Launch(3, 64, 4)


def run(comm, seed: int) -> int:
    for mod in (all_gather, all_to_all, broadcast, one_shot_all_reduce, reduce_scatter,
                two_shot_all_reduce):
        mod.launch_for = _small_launch
    r, w = comm.rank, comm.world_size
    gen = torch.Generator().manual_seed(seed + r)
    checked = 0
    for n in (w, 64 * w + w, 1037 * w):
        for rep in range(2):  # repeated calls: epochs and inbox halves advance
            x = torch.randn(n, generator=gen)
            total = x.clone()
            dist.all_reduce(total)
            for algo in ("one_shot", "two_shot"):
                torch.testing.assert_close(commlab.all_reduce(x, algorithm=algo), total)
            mx = x.clone()
            dist.all_reduce(mx, op=dist.ReduceOp.MAX)
            torch.testing.assert_close(commlab.all_reduce(x, op="max", algorithm="two_shot"), mx)
            parts = [torch.empty_like(x) for _ in range(w)]
            dist.all_gather(parts, x)
            assert torch.equal(commlab.all_gather(x), torch.cat(parts))
            c = n // w
            torch.testing.assert_close(commlab.reduce_scatter(x), total[r * c:(r + 1) * c])
            ref = torch.empty_like(x)
            dist.all_to_all_single(ref, x)
            assert torch.equal(commlab.all_to_all(x), ref)
            src = (rep + 1) % w
            ref = x.clone()
            dist.broadcast(ref, src)
            assert torch.equal(commlab.broadcast(x, src=src), ref)
            checked += 7
    return checked
