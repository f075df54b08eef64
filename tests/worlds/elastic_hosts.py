"""Rank functions for tests/test_elastic_hosts.py: a world across hosts (``COMMLAB_HOSTS``
splits one machine, the parent serves the store) loses ranks mid-training; survivors on
several hosts shrink and every public collective is checked against gloo after.
"""

from __future__ import annotations

import os
import signal
import time

import torch

import commlab
from commlab.runtime import _kill_points
from tests.worlds._checks import Checks, gloo_all_gather, gloo_all_reduce, random_tensor
from tests.worlds.hosts import _all_reduce, _overlap

DTYPES = (torch.float32, torch.int32)


def _moves(checks: Checks, gen, comm) -> None:
    """all_gather, reduce_scatter, all_to_all, broadcast from every rank, barrier."""
    W, me = comm.world_size, comm.rank
    for dtype in DTYPES:
        x = random_tensor(gen, (W * 3, 5), dtype)
        with checks.case("all_gather", f"{dtype}"):
            ref = torch.cat(gloo_all_gather(x)).to(dtype)
            torch.testing.assert_close(commlab.all_gather(x), ref, rtol=0, atol=0)
        with checks.case("reduce_scatter", f"{dtype}"):
            ref = gloo_all_reduce(x, "sum").view(W, 3, 5)[me].to(dtype)
            torch.testing.assert_close(commlab.reduce_scatter(x), ref, rtol=1e-5, atol=1e-4)
        with checks.case("all_to_all", f"{dtype}"):
            ref = torch.cat([p.view(W, 3, 5)[me] for p in gloo_all_gather(x)]).to(dtype)
            torch.testing.assert_close(commlab.all_to_all(x), ref, rtol=0, atol=0)
        for src in range(W):
            with checks.case("broadcast", f"{dtype} src={src}"):
                ref = gloo_all_gather(x)[src].to(dtype)
                torch.testing.assert_close(commlab.broadcast(x, src=src), ref, rtol=0, atol=0)
    with checks.case("barrier", "barrier, twice"):
        commlab.barrier()
        commlab.barrier()


def shrink_across_hosts_world(comm, victims: list[int], at: int, steps: int,
                              seed: int, note_dir: str, later: int = -1,
                              later_at: int = -1, point: str = "") -> dict:
    """Ranks ``victims`` SIGKILL themselves before step ``at`` of a loop of checked
    all_reduces (rank ``later`` before step ``later_at``, after the first shrink); the
    survivors shrink, redo the step from the earliest survivor's, and check the new world
    (host map, symmetric tensor contents, every collective). Rank ``later`` with a
    ``point`` instead dies at that point of the first shrink (``_kill_points``), and the
    survivors shrink again as often as it takes. A victim notes when it died
    in ``note_dir``/killed<rank>; a survivor returns when its first
    correct collective after the shrink ended (``t_first``)."""
    start = comm.rank
    if point and start == later:
        _kill_points.arm(point, lambda: os.kill(os.getpid(), signal.SIGKILL))
    rec: dict = {"pid": os.getpid(), "start_rank": start, "hosts0": comm.hosts, "steps": [],
                 "lost": []}
    kept = commlab.symmetric_empty((6,))  # this rank's rows, kept through the shrink
    kept.copy_(100.0 * start + torch.arange(6.0))
    rec["pids0"] = commlab.all_gather(torch.tensor([os.getpid()], dtype=torch.int32)).tolist()
    step = 0
    while step < steps:
        if (start in victims and step == at) or (start == later and step == later_at):
            with open(os.path.join(note_dir, f"killed{start}"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            w = comm.world_size
            y = commlab.all_reduce(torch.full((7,), float(comm.rank + 1 + step)))
            ok = bool(torch.all(y == w * (w + 1) / 2 + w * step))
            rec["steps"].append([step, w, ok])
            if rec["lost"] and "t_first" not in rec and len(rec["lost"]) == 1:
                rec["t_first"] = time.time()  # the first correct collective after the shrink
            step += 1
        except commlab.RankLostError as e:
            rec["lost"].append(e.lost)
            rec["t_lost"] = time.time()
            t0 = time.perf_counter()
            while True:  # again while a member is lost during or right after the shrink
                comm = commlab.shrink()
                rec.setdefault("shrink_s", time.perf_counter() - t0)
                try:
                    step = int(commlab.all_reduce(torch.tensor([float(step)]), op="min")[0])
                    break
                except commlab.RankLostError as again:
                    rec["lost"].append(again.lost)
    rec.update(rank=comm.rank, world_size=comm.world_size, hosts=comm.hosts,
               local=[comm.local.rank, comm.local.world_size],
               local_ctx=[int(comm.local.context[0]), int(comm.local.context[1])],
               generation=comm.generation, kept=kept.tolist())
    checks = Checks(comm.rank)
    gen = torch.Generator().manual_seed(seed + comm.rank)
    with checks.case("symmetric", "a tensor allocated before the shrink in a collective"):
        out = commlab.all_reduce(kept)
        torch.testing.assert_close(out, gloo_all_reduce(kept, "sum"), rtol=0, atol=0)
        fresh = commlab.symmetric_zeros((9,))
        assert fresh.sum().item() == 0
    _all_reduce(checks, gen)
    _moves(checks, gen, comm)
    _overlap(checks, gen, comm)
    rec.update(checks.result())
    return rec



def _after_grow(comm, seed: int) -> dict:
    """Every rank of the grown world: its place, a fresh symmetric tensor in a
    collective, every collective against gloo."""
    rec = {"pid": os.getpid(), "rank": comm.rank, "world_size": comm.world_size,
           "hosts": comm.hosts, "local": [comm.local.rank, comm.local.world_size],
           "generation": comm.generation}
    checks = Checks(comm.rank)
    gen = torch.Generator().manual_seed(seed + comm.rank)
    with checks.case("symmetric", "a symmetric tensor allocated after the grow"):
        t = commlab.symmetric_empty((6,))
        t.copy_(torch.arange(6.0) + comm.rank)
        torch.testing.assert_close(commlab.all_reduce(t), gloo_all_reduce(t, "sum"),
                                   rtol=0, atol=0)
    _moves(checks, gen, comm)
    _overlap(checks, gen, comm)
    rec.update(checks.result())
    return rec


def _rank_3_dies_and_the_rest_shrink(start: int):
    """all_reduce until rank 3 (``start``: the rank at init) SIGKILLs itself at its third
    call; the survivors catch RankLostError and shrink: their new Communicator."""
    step = 0
    while True:
        if start == 3 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            commlab.all_reduce(torch.ones(3))
            step += 1
        except commlab.RankLostError:
            return commlab.shrink()


def grow_across_hosts_world(comm, note_dir: str, seed: int) -> dict:
    """Rank 3 SIGKILLs itself; the survivors shrink (hosts [[0, 1], [2]]), then grow by
    the newcomer waiting beside them, and the grown world is checked."""
    start = comm.rank
    comm = _rank_3_dies_and_the_rest_shrink(start)
    t0 = time.perf_counter()
    comm = commlab.grow(1, timeout=60)
    grow_s = time.perf_counter() - t0
    return {**_after_grow(comm, seed), "start_rank": start, "grow_s": grow_s}


def across_newcomer(_, seed: int) -> dict:
    """The newcomer: joins the world across hosts and runs the grown world's checks."""
    comm = commlab.init(join=True)
    return {**_after_grow(comm, seed), "start_rank": None}


def grow_meets_a_death_world(comm, point: str, note_dir: str) -> dict:
    """Rank 3 dies, the survivors shrink across both hosts and call ``grow(1)`` while
    the newcomer (``join.*``) or rank 1 (``grow.*``) dies at ``point``: the grow fails
    alike everywhere and the world goes on (shrunk again when a member died). Every
    process notes its pid in ``note_dir``."""
    open(os.path.join(note_dir, f"pid{os.getpid()}"), "w").close()
    start = comm.rank
    if start == 1 and point.startswith("grow."):
        _kill_points.arm(point, lambda: os.kill(os.getpid(), signal.SIGKILL))
    rec: dict = {"start_rank": start, "pid": os.getpid()}
    comm = _rank_3_dies_and_the_rest_shrink(start)
    try:
        commlab.grow(1, timeout=60)
        rec["grow"] = "grew"
    except commlab.RankLostError as e:
        rec["grow"] = f"RankLostError: {e}"
        comm = commlab.shrink()
    except commlab.CommlabError as e:
        rec["grow"] = f"{type(e).__name__}: {e}"
    y = commlab.all_reduce(torch.full((5,), float(comm.rank + 1)))
    w = comm.world_size
    rec.update(world_size=w, hosts=comm.hosts, ok=bool(torch.all(y == w * (w + 1) / 2)))
    return rec


def dying_newcomer(_, point: str, note_dir: str) -> dict:
    """A newcomer that dies at ``point`` if it is a ``join.*`` point; refused, or
    admitted (then shrinking with the members if one is lost while it connects)."""
    open(os.path.join(note_dir, f"pid{os.getpid()}"), "w").close()
    if point.startswith("join."):
        _kill_points.arm(point, lambda: os.kill(os.getpid(), signal.SIGKILL))
    rec: dict = {"pid": os.getpid(), "start_rank": None}
    try:
        comm = commlab.init(join=True)
        rec["join"] = "joined"
    except commlab.RankLostError as e:  # admitted, then a member was lost: shrink with them
        rec["join"] = f"RankLostError: {e}"
        comm = commlab.shrink()
    except commlab.CommlabError as e:
        return {**rec, "join": f"{type(e).__name__}: {e}"}
    y = commlab.all_reduce(torch.full((5,), float(comm.rank + 1)))
    w = comm.world_size
    rec.update(world_size=w, hosts=comm.hosts, ok=bool(torch.all(y == w * (w + 1) / 2)))
    return rec
