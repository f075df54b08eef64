"""Rank functions for tests/test_elastic.py: a rank SIGKILLed at a random point of a loop
of collectives, the survivors' RankLostError, commlab.shrink() and the smaller world."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import torch

import commlab


def _note(note_dir: str, name: str, value) -> None:
    path = os.path.join(note_dir, name)
    with open(path + ".tmp", "w") as f:
        f.write(str(value))
    os.replace(path + ".tmp", path)


def _die(note_dir: str, rank: int) -> None:
    _note(note_dir, f"killed{rank}", repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _die_after(note_dir: str, rank: int, delay: float) -> None:
    t = threading.Thread(target=lambda: (time.sleep(delay), _die(note_dir, rank)), daemon=True)
    t.start()


def _step(rng: random.Random, i: int, world: int, rank: int) -> None:
    """One random collective, its result checked (sizes pick different algorithms)."""
    kind = rng.choice(["all_reduce", "all_reduce", "all_gather", "barrier", "alloc"])
    n = rng.choice([1, 7, 1000, 5000, 20000])
    if kind == "all_reduce":
        y = commlab.all_reduce(torch.full((n,), float(rank + 1)))
        assert torch.all(y == world * (world + 1) / 2), (i, kind, y[:4])
    elif kind == "all_gather":
        y = commlab.all_gather(torch.full((n,), float(rank)))
        assert torch.equal(y, torch.arange(world).repeat_interleave(n).float()), (i, kind)
    elif kind == "barrier":
        commlab.barrier()
    else:
        commlab.symmetric_zeros((n,))


def kill_and_shrink_world(comm, victim: int, when: str, delay: float, seed: int,
                          note_dir: str, second: int = -1) -> dict:
    """Every rank loops random collectives; ``victim`` dies ``when`` = "timer" (a thread
    SIGKILLs it ``delay`` s into the loop: anywhere, kernels included) or "before" (at
    the call ``int(delay * 100)``: its peers wait in the agreement or an ahead kernel).
    ``second`` (>= 0): that rank dies too, ``delay`` / 10 s into its shrink. Survivors
    catch RankLostError, shrink (again if a member is lost meanwhile) and check the new
    world, the symmetric tensor allocated before and the times."""
    _note(note_dir, f"pid{comm.rank}", os.getpid())
    old_rank, world = comm.rank, comm.world_size
    kept = commlab.symmetric_zeros((257,))
    kept.fill_(float(old_rank))
    rng = random.Random(seed)  # the same collectives on every rank
    commlab.barrier()
    if old_rank == victim and when == "timer":
        _die_after(note_dir, old_rank, delay)
    errors, i = [], 0
    try:
        while True:
            if old_rank == victim and when == "before" and i == int(delay * 100):
                _die(note_dir, old_rank)
            _step(rng, i, world, old_rank)
            i += 1
    except commlab.RankLostError as e:
        caught = time.time()
        errors.append({"lost": e.lost, "op": e.op, "text": str(e)})
    if old_rank == second:
        _die_after(note_dir, old_rank, delay / 10)
    shrinks = 0
    while True:
        try:
            new = commlab.shrink()
            shrinks += 1
            y = commlab.all_reduce(torch.full((1000,), float(new.rank + 1)))
            done = time.time()
            break
        except commlab.RankLostError as e:  # another member died during the shrink
            errors.append({"lost": e.lost, "op": e.op, "text": str(e)})
    w = new.world_size
    z = commlab.all_reduce(kept)  # the old tensor, in a collective of the new world
    return {"old_rank": old_rank, "rank": new.rank, "world": w, "calls": i,
            "errors": errors, "caught": caught, "done": done, "shrinks": shrinks,
            "generation": new.generation, "same_comm": commlab.get_communicator() is new,
            "y_ok": bool(torch.all(y == w * (w + 1) / 2)),
            "kept_ok": bool(torch.all(kept == old_rank)), "z": float(z[0]),
            "again": float(commlab.all_reduce(torch.ones(3))[0])}


def store_rank_dies_world(comm, note_dir: str) -> dict:
    """Rank 0, which serves the store, dies; the others' RankLostError and shrink."""
    _note(note_dir, f"pid{comm.rank}", os.getpid())
    commlab.barrier()
    if comm.rank == 0:
        _die(note_dir, 0)
    try:
        commlab.all_reduce(torch.ones(10))
    except commlab.RankLostError as e:
        caught, text = time.time(), str(e)
    t0 = time.monotonic()
    try:
        commlab.shrink()
        shrink = "returned"
    except commlab.CommlabError as e:
        shrink = f"{type(e).__name__}: {e}"
    return {"caught": caught, "text": text, "shrink": shrink,
            "shrink_s": time.monotonic() - t0}
