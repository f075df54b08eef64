"""Rank functions for tests/test_elastic.py: a rank SIGKILLed at a random point of a loop
of collectives, the survivors' RankLostError, commlab.shrink() and the smaller world; a
newcomer joining through ``commlab.elastic.step`` while a member or the newcomer dies at a
point of the join."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import torch
import triton

import commlab
import commlab.language as cl
from commlab import elastic
from commlab._interpreter import host
from commlab.runtime import _kill_points
from commlab.runtime.membership import alive


def _note(note_dir: str, name: str, value) -> None:
    path = os.path.join(note_dir, name)
    tmp = f"{path}.{os.getpid()}.tmp"  # several ranks may write the same note at once
    with open(tmp, "w") as f:
        f.write(str(value))
    os.replace(tmp, path)


def _die(note_dir: str, rank: int) -> None:
    _note(note_dir, f"killed{rank}", repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _die_after(note_dir: str, rank: int, delay: float) -> None:
    t = threading.Thread(target=lambda: (time.sleep(delay), _die(note_dir, rank)), daemon=True)
    t.start()


def _die_in_next_kernel(note_dir: str, rank: int) -> None:
    """SIGKILL this rank at its next poll inside a kernel's wait (mid-kernel: it may have
    signalled some peers and not others)."""
    host.set_wait_observer(lambda kind, addr, want: kind == "poll" and _die(note_dir, rank))


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


def _origin(lost: list[int]) -> list[int]:
    """Lost ranks (numbered in the current world) as ``init`` ranks."""
    origin = commlab.get_communicator().members.origin
    return [origin[r] for r in lost]


def elastic_rounds_world(comm, plan: list[dict], seed: int, note_dir: str) -> dict:
    """Rounds of: every rank loops random collectives (the same on every rank), one rank
    dies, the survivors catch RankLostError, shrink and check the smaller world. Each
    round of ``plan`` names ranks by their ``init`` rank: ``victim`` dies ``when`` =
    "timer" (a thread SIGKILLs it ``delay`` s into the loop: anywhere), "agreement"
    (before call ``call``: peers wait in the agreement or an ahead kernel) or "kernel"
    (at its first poll inside a kernel from call ``call`` on); ``second`` (>= 0) dies
    in its shrink, at ``second_at``: a point of ``_kill_points.SHRINK_POINTS`` or
    "timer" (``delay / 10`` s in: before, during or after the survivors agree; they
    shrink again when it is still a member)."""
    me = comm.rank  # the init rank names this process in the plan
    _note(note_dir, f"pid{me}", os.getpid())
    kept = commlab.symmetric_zeros((257,))
    kept.fill_(float(me))
    rounds = []
    for k, rnd in enumerate(plan):
        if rnd.get("join"):
            rounds.append(_join_round(me, rnd, note_dir))
            continue
        rng = random.Random(seed * 100 + k)  # the same collectives on every rank
        comm = commlab.get_communicator()
        rank, world = comm.rank, comm.world_size
        commlab.barrier()
        when = rnd["when"] if me == rnd["victim"] else None
        if when == "timer":
            _die_after(note_dir, me, rnd["delay"])
        errors, i = [], 0
        try:
            while True:
                if when == "agreement" and i == rnd["call"]:
                    _die(note_dir, me)
                if when == "kernel" and i == rnd["call"]:
                    _die_in_next_kernel(note_dir, me)
                _step(rng, i, world, rank)
                i += 1
        except commlab.RankLostError as e:
            caught = time.time()
            errors.append(_origin(e.lost))
            text = str(e)
        second = rnd.get("second", -1)
        if me == second and rnd.get("second_at", "timer") == "timer":
            _die_after(note_dir, me, rnd["delay"] / 10)
        elif me == second:
            _kill_points.arm(rnd["second_at"], lambda: _die(note_dir, me))
        shrinks = 0
        while True:
            try:
                new = commlab.shrink()
                shrunk = time.time()
                shrinks += 1
                if me == second:
                    time.sleep(60)  # its timer kills it: it never leaves its shrink
                w = new.world_size
                y = commlab.all_reduce(torch.full((1000,), float(new.rank + 1)))
                done = time.time()
                assert torch.all(y == w * (w + 1) / 2), ("first all_reduce", w, y[:4])
                z = commlab.all_reduce(kept)  # a tensor of the first world, used in this one
                break
            except commlab.RankLostError as e:  # a member died during the shrink
                errors.append(_origin(e.lost))
        members = list(new.members.origin)
        rounds.append({
            "errors": errors, "text": text, "caught": caught, "shrunk": shrunk, "done": done,
            "calls": i,
            "shrinks": shrinks, "rank": new.rank, "world": w, "members": members,
            "generation": new.generation, "current": commlab.get_communicator() is new,
            "rank_is_index": new.rank == members.index(me),
            "kept_ok": bool(torch.all(kept == me)), "z_ok": bool(torch.all(z == sum(members)))})
    return {"me": me, "rounds": rounds}


JOIN_STEPS = 2  # elastic steps a join round runs at least


def _join_round(me: int, rnd: dict, note_dir: str) -> dict:
    """The members' join round: a newcomer (``elastic_newcomer``) registers once rank 0
    says so, ``elastic.step`` admits it at a step boundary, and ``victim`` (an init rank,
    or "new": the newcomer) dies at the join point ``at``."""
    comm = commlab.get_communicator()
    before = comm.world_size
    acc = commlab.symmetric_zeros((33,))
    state = elastic.State(acc=acc, step=0)
    commlab.barrier()  # every member is in the round before the newcomer may register
    if me == rnd["victim"]:
        _kill_points.arm(rnd["at"], lambda: _die(note_dir, me))
    if comm.rank == 0:
        _note(note_dir, "join_round", 1)
    log = _elastic_steps(state, note_dir)
    return {"join": True, **_joined_world(state, before, log)}


def _elastic_steps(state, note_dir: str) -> list:
    """``elastic.step`` until JOIN_STEPS steps are done and the newcomer is a member or
    dead (rank 0 decides, every member reads its verdict); each step's all_reduce is
    checked and adds 1 to the symmetric ``acc``. Returns (step, world size) per commit."""
    log = []
    while True:
        stop = None
        with elastic.step(state, grow_timeout=1.5):
            comm = commlab.get_communicator()
            w = comm.world_size
            y = commlab.all_reduce(torch.full((100,), float(comm.rank + 1)))
            assert torch.all(y == w * (w + 1) / 2), ("elastic step", w, y[:4])
            state.acc.add_(1.0)
            state.step += 1
            stop = comm.members.share(
                "stop", str(int(_settled(comm, state, note_dir))) if comm.rank == 0 else None)
        if stop is not None:  # committed (a step that met a loss is redone)
            log.append((state.step, w))
            if stop == "1":
                return log


def _settled(comm, state, note_dir: str) -> bool:
    path = os.path.join(note_dir, "pid_new")
    if state.step < JOIN_STEPS or not os.path.exists(path):
        return False
    with open(path) as f:
        pid = int(f.read())
    return pid in comm.members.pids or not alive(pid)


def _joined_world(state, before: int, log: list) -> dict:
    comm = commlab.get_communicator()
    w = comm.world_size
    y = commlab.all_reduce(torch.full((1000,), float(comm.rank + 1)))
    return {"before": before, "world": w, "rank": comm.rank, "step": state.step,
            "log": log, "members": list(comm.members.origin), "pids": list(comm.members.pids),
            "generation": comm.generation, "events": list(state.events),
            "acc_ok": bool(torch.all(state.acc == state.step)),
            "y_ok": bool(torch.all(y == w * (w + 1) / 2)),
            "current": commlab.get_communicator() is comm}


def elastic_newcomer(_, note_dir: str, at: str | None = None) -> dict:
    """The join round's newcomer: waits for rank 0's note, notes its pid, joins (again
    after a grow that aborted; after a loss in its own join it shrinks with the members)
    and runs the members' elastic steps; ``at``: the join point where it dies."""
    while not os.path.exists(os.path.join(note_dir, "join_round")):
        time.sleep(0.005)
    _note(note_dir, "pid_new", os.getpid())
    if at is not None:
        _kill_points.arm(at, lambda: _die(note_dir, -1))
    attempts = []
    deadline = time.monotonic() + 30
    while True:
        try:
            commlab.init(join=True, timeout=max(1.0, deadline - time.monotonic()))
            break
        except commlab.RankLostError as e:  # a member died while the grown group connected
            attempts.append(f"lost {e.lost}")
            commlab.shrink()
            break
        except commlab.CommlabError as e:  # the grow aborted: wait for the next one
            attempts.append(str(e)[:120])
            if time.monotonic() > deadline:
                raise
    state = elastic.State(acc=None, step=0)
    log = _elastic_steps(state, note_dir)
    return {"me": "new", "attempts": attempts, **_joined_world(state, -1, log)}


@triton.jit
def _barrier_kernel(ctx):
    cl.barrier(ctx)


def store_rank_dies_world(comm, note_dir: str) -> dict:
    """Rank 0, which serves the store, dies while the others wait for it in a user
    kernel's ``cl.barrier``; their RankLostError and shrink."""
    _note(note_dir, f"pid{comm.rank}", os.getpid())
    commlab.barrier()
    # rank 0 leaves the barrier first maybe: it dies once every peer has left it too (a
    # peer still waiting in it for a third rank would see the death there)
    _note(note_dir, f"past{comm.rank}", 1)
    if comm.rank == 0:
        while not all(os.path.exists(os.path.join(note_dir, f"past{r}"))
                      for r in range(comm.world_size)):
            time.sleep(0.005)
        _die(note_dir, 0)
    try:
        _barrier_kernel[(1,)](comm.context)
    except commlab.RankLostError as e:
        caught, text = time.time(), str(e)
    # a survivor that has caught it stays until every survivor has: one that left first
    # would be a second lost rank to a survivor still waiting
    _note(note_dir, f"caught{comm.rank}", 1)
    deadline = time.monotonic() + 30
    notes = [os.path.join(note_dir, f"caught{r}") for r in range(1, comm.world_size)]
    while time.monotonic() < deadline and not all(map(os.path.exists, notes)):
        time.sleep(0.005)
    t0 = time.monotonic()
    try:
        commlab.shrink()
        shrink = "returned"
    except commlab.CommlabError as e:
        shrink = f"{type(e).__name__}: {e}"
    return {"caught": caught, "text": text, "shrink": shrink,
            "shrink_s": time.monotonic() - t0}
