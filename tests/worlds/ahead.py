"""Rank function for tests/test_async_agreement.py: repeated calls skip the agreement's
wait, a mismatch found late raises the same error on every rank, and the calls that must
wait (first call of a plan, plan change, allocation, barrier, a full ring) do."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import commlab
from commlab.runtime import Signature
from tests.worlds._checks import Checks, same_error_everywhere


def _waits(comm) -> int:
    return comm.control.waits


def _late_mismatch(checks: Checks, texts: dict, section: str, comm, x, wrong,
                   where: str) -> None:
    """Rank 1 makes the call ``wrong`` (it waits: a plan change) while rank 0 repeats
    ``all_reduce(x)`` (ahead). Every rank must raise one RankMismatchError with the same
    text: rank 1 at its call, rank 0 at ``where`` ("synchronize" or "next call")."""
    rank, world = comm.rank, comm.world_size
    with checks.case(section, "the mismatch raises on every rank"):
        commlab.all_reduce(x)
        commlab.all_reduce(x)  # the previous call's plan: rank 0 runs the next one ahead
        msg = ""
        try:
            if rank == 1:
                wrong()
            else:
                before = _waits(comm)
                commlab.all_reduce(x)  # returns: the mismatch is not known yet
                assert _waits(comm) == before, "the repeated call waited"
                if where == "synchronize":
                    comm.synchronize()
                else:
                    commlab.all_reduce(x)
        except commlab.RankMismatchError as e:
            msg = str(e)
        same_error_everywhere(msg, rank, world, where)
        texts[section] = msg
    with checks.case(section, "the next correct call works"):
        out = commlab.all_reduce(x)
        assert torch.equal(out, x * world), out


def ahead_world(comm) -> dict:
    checks = Checks(comm.rank)
    rank, world = comm.rank, comm.world_size
    x = torch.arange(24, dtype=torch.float32)

    with checks.case("repeat", "repeated identical calls do not wait, results stay right"):
        commlab.all_reduce(x)  # first call of the plan: waits
        before = _waits(comm)
        for _ in range(12):
            if rank == 0:
                time.sleep(0.02)  # rank 1 reaches each call first
            out = commlab.all_reduce(x)
            assert torch.equal(out, x * world), out
        comm.synchronize()
        assert _waits(comm) == before, f"{_waits(comm) - before} of 12 repeated calls waited"

    with checks.case("ring", "a rank publishes RING calls ahead of a sleeping peer, then waits"):
        ring = comm.control.RING
        sig = Signature("probe", {"shape": (8,)})
        raw = sig.encode()
        comm.control.ahead.allow(raw, lambda: None)  # a host-only call: no kernel to drain
        comm.control.agree(sig, raw)  # agreed once, and now this rank's previous call
        dist.barrier()
        start = time.time()
        returned = []
        if rank == 0:
            time.sleep(1.0)
        woke = time.time()
        for _ in range(ring + 1):
            comm.control.agree(sig, raw, ahead=True)
            returned.append(time.time())
        comm.control.settle()
        woke_0 = [None] * world
        dist.all_gather_object(woke_0, woke)
        if rank == 1:
            early = [t - start for t in returned[:ring]]
            assert max(early) < 0.5, f"rank 1's first {ring} calls took {early} s"
            assert returned[ring] >= woke_0[0], (
                f"call {ring + 1} returned {returned[ring] - start:.3f} s in, before rank 0 "
                f"woke at {woke_0[0] - start:.3f} s: the full ring did not wait")
        comm.control.agree(Signature("probe_end", {}))

    with checks.case("plan_change", "a different call in between makes the next one wait"):
        y = torch.ones(8)
        commlab.all_reduce(y)  # y's plan exists; x's call next is a plan change
        before = _waits(comm)
        for _ in range(3):
            commlab.all_reduce(x)
            commlab.all_reduce(y)
        assert _waits(comm) - before == 6, f"{_waits(comm) - before} of 6 alternating calls waited"

    with checks.case("allocation", "an allocation waits and so does the call after it"):
        commlab.all_reduce(x)
        commlab.all_reduce(x)
        before = _waits(comm)
        t = commlab.symmetric_empty((16,))
        assert _waits(comm) - before == 1, "the allocation did not wait"
        commlab.all_reduce(x)
        assert _waits(comm) - before == 2, "the call after an allocation did not wait"
        commlab.all_reduce(x)
        assert _waits(comm) - before == 2, "the repeated call after it waited"
        del t

    with checks.case("barrier", "barrier waits and checks the calls that ran ahead"):
        commlab.all_reduce(x)
        commlab.all_reduce(x)
        assert comm.control.ahead.pending, "the repeated call did not run ahead"
        before = _waits(comm)
        commlab.barrier()
        assert _waits(comm) - before == 1
        assert not comm.control.ahead.pending, "barrier left calls unchecked"

    with checks.case("switch_off", "with the switch off every call waits"):
        comm.control.ahead.enabled = False
        try:
            commlab.all_reduce(x)
            before = _waits(comm)
            for _ in range(3):
                commlab.all_reduce(x)
            assert _waits(comm) - before == 3
        finally:
            comm.control.ahead.enabled = True

    texts: dict = {}
    _late_mismatch(checks, texts, "late_op_value", comm, x,
                   lambda: commlab.all_reduce(x, op="max"), "synchronize")
    _late_mismatch(checks, texts, "late_collective", comm, x,
                   lambda: commlab.all_gather(x), "next call")
    _late_mismatch(checks, texts, "late_shape", comm, x,
                   lambda: commlab.all_reduce(torch.ones(5)), "next call")
    return {**checks.result(), "texts": texts}
