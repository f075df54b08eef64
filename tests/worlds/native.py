"""Rank function for tests/test_native_fastcall.py: repeated calls served by the launch
plan's C twin stay correct, never hand out a result the caller holds, and a mismatch one
rank makes while the other runs ahead through the C path raises on every rank."""

from __future__ import annotations

import sys

import torch

import commlab
from tests.worlds._checks import Checks, same_error_everywhere


def _hits(comm) -> int:
    """Calls served in C: by a plan's entry, called from Python or from the dispatch."""
    return sum(p.entry.hits for p in comm.plans.values() if p.entry is not None)


def _online(comm, n: int = 160) -> None:
    """``auto`` under online selection: Python picks at its decisions, bursts and
    explorations only; the C dispatch serves the calls between (its budget), every call
    is counted, and every rank runs the same algorithm on every call."""
    from commlab.collectives import _adapt
    from commlab.runtime import records

    was = getattr(comm, "adapt_on", None)
    comm.adapt_on = (comm.generation, True)  # on for this section (off on GPUs by default)
    pick, picks = _adapt.pick, [0]

    def counted(*a, **kw):
        picks[0] += 1
        return pick(*a, **kw)

    _adapt.pick = counted
    try:
        rank, world = comm.rank, comm.world_size
        x = torch.arange(96, dtype=torch.float32, device=comm.device) + rank
        want = torch.arange(96, dtype=torch.float32, device=comm.device) * world + sum(range(world))
        for i in range(n):
            x[0] = i + rank
            want[0] = i * world + sum(range(world))
            out = commlab.all_reduce(x)
            assert torch.equal(out, want), (i, out[:2], want[:2])
        commlab.synchronize()
        key = _adapt.key_for(comm, "all_reduce", x)
        assert _adapt.state(comm)[key]["calls"] == n, _adapt.state(comm)[key]["calls"]
        assert picks[0] <= n // 3, f"Python picked {picks[0]} of {n} calls"
        if records.enabled():  # the algorithm of every call, compared across ranks
            names = ("one_shot", "two_shot", "ring")
            ran = [names.index(r.algorithm) for r in records.recent(comm)
                   if r.op == "all_reduce" and r.nbytes == x.numel() * 4][-n:][:n - 1]
            # (the last call's record may not be collected yet: compare the calls before)
            assert len(ran) == n - 1, f"{len(ran)} records of {n} calls"
            mine = torch.tensor(ran, dtype=torch.float32, device=comm.device)
            every = commlab.all_gather(mine).view(world, n - 1)
            assert bool((every == every[0]).all()), "ranks ran different algorithms"
    finally:
        _adapt.pick = pick
        comm.adapt_on = was


def native_world(comm) -> dict:
    checks = Checks(comm.rank)
    rank, world = comm.rank, comm.world_size
    texts: dict = {}

    with checks.case("served", "repeated calls are served in C and stay right"):
        x = torch.arange(40, dtype=torch.float32) + rank
        before_hits, before_waits = _hits(comm), comm.control.waits
        for i in range(20):
            x[0] = i + rank  # a new value each call: the result must follow it
            out = commlab.all_reduce(x)
            want = torch.arange(40, dtype=torch.float32) * world + sum(range(world))
            want[0] = i * world + sum(range(world))
            assert torch.equal(out, want), (i, out[:4], want[:4])
        served, waited = _hits(comm) - before_hits, comm.control.waits - before_waits
        assert served >= 18, f"only {served} of 20 repeated calls took the C path"
        assert waited <= 2, f"{waited} of 20 repeated calls waited"
        g = torch.full((8,), float(rank))
        for _ in range(5):  # alternating ops: each call changes plan, so each waits
            gathered = torch.arange(world).repeat_interleave(8).float()
            assert torch.equal(commlab.all_gather(g), gathered)
            assert torch.equal(commlab.broadcast(g, src=1), torch.full((8,), 1.0))

    with checks.case("held", "a result the caller holds is never written again"):
        x = torch.zeros(16)
        kept = []
        for i in range(8):
            x.fill_(i)
            kept.append(commlab.all_reduce(x))
        for i, t in enumerate(kept):
            assert torch.equal(t, torch.full((16,), float(i * world))), (i, t[:2])
        assert len({t.data_ptr() for t in kept}) == len(kept)

    with checks.case("reuse", "a dropped result's buffer is handed out again"):
        x = torch.ones(20)  # not the held section's plan: its 4 outputs are all held
        ptrs = {commlab.all_reduce(x).data_ptr() for _ in range(10)}
        assert len(ptrs) <= 2, f"{len(ptrs)} buffers for 10 dropped results"

    with checks.case("mismatch", "a mismatch behind a C-path call raises on every rank"):
        x = torch.arange(24, dtype=torch.float32)
        for _ in range(3):  # the last one served through the dispatch, from this line
            commlab.all_reduce(x)
        msg, hits, site, line = "", _hits(comm), None, -1
        try:
            if rank == 1:
                commlab.all_reduce(x, op="max")
            else:
                line = sys._getframe().f_lineno + 1  # the line of the call below
                commlab.all_reduce(x)  # runs ahead in C: the mismatch is not known yet
                assert _hits(comm) == hits + 1, "the repeated call did not take the C path"
                commlab.all_reduce(x)  # the C path sees the digest differ, hands over
        except commlab.RankMismatchError as e:
            msg, site = str(e), getattr(e, "ran_ahead_at", None)
        same_error_everywhere(msg, rank, world)
        if rank == 0:  # the line of the call that ran ahead, not of the calls before it
            assert site is not None and site[0] == __file__ and site[1] == line, (site, line)
        texts["mismatch"] = msg
        out = commlab.all_reduce(x)
        assert torch.equal(out, x * world), out

    with checks.case("online", "auto calls between online selection's picks are served in C"):
        _online(comm)

    with checks.case("inplace", "the torch backend's in-place all_reduce is served in C"):
        from commlab.torch_backend import _into

        t = torch.zeros(12)
        hits = _hits(comm)
        for i in range(10):
            t.fill_(i + rank)
            y = _into.all_reduce_(t, "sum", "auto")
            assert y.data_ptr() == t.data_ptr(), "not reduced into the caller's tensor"
            assert torch.equal(t, torch.full((12,), float(i * world + sum(range(world))))), t
        assert _hits(comm) - hits >= 8, f"{_hits(comm) - hits} of 10 in-place calls in C"
        hits = _hits(comm)
        for i in range(10):  # the output is the caller's tensor, a new view each call
            g = torch.full((1, 6), float(i + rank))
            out = torch.empty(world * 6)
            y = _into.all_gather(g, out.view(world, 6))
            assert y.data_ptr() == out.data_ptr(), "not gathered into the caller's tensor"
            want = (torch.arange(world, dtype=torch.float32) + i).repeat_interleave(6)
            assert torch.equal(out, want), (i, out)
        assert _hits(comm) - hits >= 8, f"{_hits(comm) - hits} of 10 gathers into out in C"

    commlab.synchronize()
    return {**checks.result(), "texts": texts}
