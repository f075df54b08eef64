"""Rank functions for tests/test_elastic_grow.py: newcomers that join a running world
(``commlab.init(join=True)``) while the members call ``commlab.grow``."""

from __future__ import annotations

import os
import signal
import threading
import time

import torch

import commlab
from commlab.elastic import State
from tests.worlds.elastic import _note


def _check_world(comm, kept, expect_kept: float) -> dict:
    """Collectives of the grown world, on a fresh tensor, on a tensor of the old world,
    and a fresh allocation (its offset agreed by every rank)."""
    w = comm.world_size
    y = commlab.all_reduce(torch.full((1000,), float(comm.rank + 1)))
    z = commlab.all_reduce(kept)
    g = commlab.all_gather(torch.full((3,), float(comm.rank)))
    fresh = commlab.symmetric_zeros((129,))
    return {"rank": comm.rank, "world": w, "generation": comm.generation,
            "current": commlab.get_communicator() is comm,
            "y_ok": bool(torch.all(y == w * (w + 1) / 2)),
            "z_ok": bool(torch.all(z == expect_kept)),
            "g_ok": bool(torch.equal(g, torch.arange(w).repeat_interleave(3).float())),
            "fresh_offset": comm.heap.offset_of(fresh), "kept_offset": comm.heap.offset_of(kept),
            "pid": os.getpid()}


def grow_member(comm, note_dir: str, n: int = 1, kill: int = -1) -> dict:
    """Members: a symmetric tensor, (maybe a rank SIGKILLed and a shrink), then grow by n."""
    _note(note_dir, f"pid{comm.rank}", os.getpid())
    kept = commlab.symmetric_zeros((257,))
    kept.fill_(1.0)
    state = State(kept=kept, step=7)
    commlab.barrier()
    if kill >= 0:
        if comm.rank == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            while True:
                commlab.all_reduce(torch.ones(10))
        except commlab.RankLostError:
            comm = commlab.shrink()
        _note(note_dir, "shrunk", comm.world_size)
    t0 = time.time()
    new = commlab.grow(n, timeout=60)
    grown = time.time()
    sent = state.sync()
    out = _check_world(new, kept, float(new.world_size))
    return {**out, "grow_s": grown - t0, "sent": sent, "old_closed": comm.closed,
            "step": state.step}


def newcomer(_, note_dir: str, wait_for: str = "") -> dict:
    """A newcomer: waits for ``wait_for`` (a note) if given, joins, receives the state."""
    while wait_for and not os.path.exists(os.path.join(note_dir, wait_for)):
        time.sleep(0.01)
    t0 = time.time()
    comm = commlab.init(join=True)
    joined = time.time()
    _note(note_dir, f"pid_new{comm.rank}", os.getpid())
    state = State(kept=None, step=0)
    state.sync()
    out = _check_world(comm, state.kept, float(comm.world_size))
    done = time.time()
    return {**out, "join_s": joined - t0, "first_collective_s": done - t0,
            "step": state.step, "received": state.last_sync["bytes"]}


def grow_times_out(comm) -> dict:
    """Members call grow with nobody waiting: the same error everywhere, the world goes on."""
    t0 = time.monotonic()
    try:
        commlab.grow(1, timeout=1.0)
        err = ""
    except commlab.CommlabError as e:
        err = f"{type(e).__name__}: {e}"
    waited = time.monotonic() - t0
    y = commlab.all_reduce(torch.ones(5))
    return {"err": err, "waited": waited, "ok": bool(torch.all(y == comm.world_size)),
            "same": commlab.get_communicator() is comm}


def idle(comm) -> None:
    time.sleep(4)  # a newcomer's 1 s timeout passes while nobody grows


def lonely_newcomer(_) -> dict:
    """A newcomer nobody admits: a clear error after its timeout."""
    t0 = time.monotonic()
    try:
        commlab.init(join=True, timeout=1.0)
        err = ""
    except commlab.CommlabError as e:
        err = f"{type(e).__name__}: {e}"
    return {"err": err, "waited": time.monotonic() - t0}


def doomed_newcomer(_, note_dir: str, delay: float) -> dict:
    """A newcomer that SIGKILLs itself ``delay`` s after the grow admitted it."""
    from commlab.runtime import _grow

    def die_when_admitted() -> None:
        key = _grow._store_key()
        while True:
            joins = _grow._JOINS.get(key)
            if joins is not None and joins.check(["admit/1"]):
                break
            time.sleep(0.001)
        time.sleep(delay)
        _note(note_dir, "newcomer_killed", time.time())
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=die_when_admitted, daemon=True).start()
    commlab.init(join=True)
    time.sleep(60)  # the timer kills it in the grow or right after


def members_survive_a_dying_newcomer(comm) -> dict:
    """Members grow while the newcomer dies: a clear error or a RankLostError (then
    shrink); either way the members end in a working world of their own."""
    kept = commlab.symmetric_zeros((64,))
    kept.fill_(float(comm.rank))
    commlab.barrier()
    try:
        new = commlab.grow(1, timeout=30)
        outcome = "grown"
        try:
            commlab.all_reduce(torch.ones(4))
            commlab.barrier()
        except commlab.RankLostError:
            new = commlab.shrink()
            outcome = "grown then shrunk"
    except commlab.RankLostError as e:
        new, outcome = commlab.shrink(), f"lost: {e}"
    except commlab.CommlabError as e:
        new, outcome = commlab.get_communicator(), f"{type(e).__name__}: {e}"
    w = new.world_size
    y = commlab.all_reduce(torch.full((100,), float(new.rank + 1)))
    z = commlab.all_reduce(kept)
    return {"outcome": outcome, "world": w, "ok": bool(torch.all(y == w * (w + 1) / 2)),
            "z_ok": bool(torch.all(z == sum(range(w))))}
