"""Rank functions for tests/test_cpu_twins.py: host twins against the interpreter."""

from __future__ import annotations

import os

import torch

import commlab
from commlab._interpreter import twins

SIZES = (1, 7, 1037)


def _calls(world: int, gen: torch.Generator):
    """(label, call) for every op with a twin, fresh random data each."""
    for n in SIZES:
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            x = (torch.randn(n, generator=gen) * 100).to(dtype)
            for algo in ("one_shot", "two_shot"):
                for op in ("sum", "max"):
                    yield (f"all_reduce {algo} {op} n={n} {dtype}",
                           lambda x=x, a=algo, o=op: commlab.all_reduce(x, op=o, algorithm=a))
        x = torch.randn(n * world, generator=gen)
        yield f"all_gather n={n}", lambda x=x, n=n: commlab.all_gather(x[:n])
        yield f"reduce_scatter n={n}", lambda x=x: commlab.reduce_scatter(x, op="sum")
        yield f"all_to_all n={n}", lambda x=x: commlab.all_to_all(x)
        for src in range(world):
            yield f"broadcast src={src} n={n}", lambda x=x, s=src: commlab.broadcast(x, src=s)


def same_bits_world(comm, seed: int, interpreted_ranks: tuple[int, ...]) -> dict:
    """Every call twice on fresh data: once as twins (the ranks in ``interpreted_ranks``
    run the interpreter instead), once with every rank in the interpreter; returns the
    labels whose results differ and how many launches ran as twins."""
    gen = torch.Generator().manual_seed(seed * 100 + comm.rank)
    differ, before = [], sum(twins.RAN.values())
    mine = "0" if comm.rank in interpreted_ranks else "1"
    for label, call in _calls(comm.world_size, gen):
        os.environ["COMMLAB_CPU_TWINS"] = mine
        fast = call()
        os.environ["COMMLAB_CPU_TWINS"] = "0"
        slow = call()
        if not torch.equal(fast, slow):
            differ.append(label)
    os.environ.pop("COMMLAB_CPU_TWINS")
    comm.synchronize()
    return {"differ": differ, "twin_launches": sum(twins.RAN.values()) - before}


def racecheck_world(comm) -> dict:
    """Twin launches outside and inside ``commlab.racecheck()``."""
    x = torch.ones(64)
    counts = []
    for checked in (False, True, False):
        before = sum(twins.RAN.values())
        if checked:
            with commlab.racecheck():
                out = commlab.all_reduce(x)
        else:
            out = commlab.all_reduce(x)
        assert torch.equal(out, x * comm.world_size)
        counts.append(sum(twins.RAN.values()) - before)
    return {"twin_launches": counts}
