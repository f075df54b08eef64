"""Rank functions for tests/test_init_settings.py: init arguments and COMMLAB_* settings
that differ across ranks, and a heap full on one rank only."""

from __future__ import annotations

import os

import commlab


def _init_error(**kwargs) -> str:
    try:
        commlab.init(backend="cpu", **kwargs)
    except commlab.CommlabUsageError as e:
        return f"{type(e).__name__}: {e}"
    return "initialised"


def differing_scratch(comm) -> dict:
    rank = int(os.environ["RANK"])
    first = _init_error(heap_size="32MiB", scratch_size="8MiB" if rank == 1 else "4MiB")
    again = commlab.init(backend="cpu", heap_size="32MiB", scratch_size="4MiB")  # usable
    y = commlab.all_reduce(commlab.symmetric_zeros((3,)) + 1.0).tolist()
    return {"first": first, "sum": y, "world": again.world_size}


def differing_env(comm) -> str:
    if int(os.environ["RANK"]) == 2:
        os.environ["COMMLAB_ROUNDS"] = "4"
    return _init_error()


def heap_full_on_one_rank(comm) -> str:
    rank = comm.rank
    try:
        commlab.symmetric_empty((1 << 30,) if rank == 1 else (64,))
    except commlab.CommlabError as e:
        return f"{type(e).__name__}: {e}"
    return "allocated"
