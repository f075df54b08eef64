"""Rank function for tests/test_errors.py: a second thread calling a collective on a
communicator while another thread is inside one is refused, and the world stays usable."""

from __future__ import annotations

import threading
import time

import torch

import commlab
from tests.worlds._checks import Checks


def two_threads_world(comm) -> dict:
    checks = Checks(comm.rank)
    rank, world = comm.rank, comm.world_size
    got: dict = {}
    with checks.case("two_threads", "the second thread is refused with the rule"):
        if rank == 0:
            # the worker waits in the agreement until rank 1 arrives (1 s from now)
            def work():
                got["out"] = commlab.all_reduce(torch.ones(8))
            t = threading.Thread(target=work, name="worker")
            t.start()
            time.sleep(0.3)
            try:
                commlab.all_reduce(torch.ones(8))
            except commlab.CommlabUsageError as e:
                msg = str(e)
                for needle in ("thread 'MainThread'", "thread 'worker'", "one thread at a time"):
                    assert needle in msg, msg
            else:
                raise AssertionError("no CommlabUsageError for the second thread")
            t.join()
            assert torch.equal(got["out"], torch.full((8,), float(world))), got
        else:
            time.sleep(1.0)
            commlab.all_reduce(torch.ones(8))
    with checks.case("two_threads", "world usable afterwards"):
        out = commlab.all_reduce(torch.full((33,), 1.0))
        assert torch.equal(out, torch.full((33,), float(world))), out
    return checks.result()
