"""Host twins (commlab._interpreter.twins): the CPU backend's collectives without the
interpreter's per-operation cost, bit for bit what the kernels compute, and the
interpreter whenever a checker watches."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from commlab._interpreter import blocked, hostmem, liveness
from commlab.errors import CollectiveTimeoutError
from tests.worlds.cpu_twins import racecheck_world, same_bits_world


@pytest.mark.parametrize("world_size", [3, 4])
def test_twins_compute_the_kernels_bits_for_every_op(world, seed, world_size):
    res = world(same_bits_world, world_size, seed, ())
    assert all(r["twin_launches"] > 0 for r in res)
    assert [r["differ"] for r in res] == [[]] * world_size


def test_a_rank_in_the_interpreter_and_ranks_on_twins_interoperate(world, seed):
    # the same flags, epochs and inboxes: one rank interpreting, two on twins, every call
    res = world(same_bits_world, 3, seed, (1,))
    assert res[1]["twin_launches"] == 0 and res[0]["twin_launches"] > 0
    assert [r["differ"] for r in res] == [[]] * 3


def test_racecheck_runs_the_kernels_in_the_interpreter(world):
    res = world(racecheck_world, 2)
    for r in res:
        before, inside, after = r["twin_launches"]
        assert before == 1 and inside == 0 and after == 1


def test_a_blocked_twin_wait_is_registered_with_its_line_and_released():
    cell = ctypes.c_int32(0)
    addr = ctypes.addressof(cell)
    t = threading.Thread(target=hostmem.wait_at_least, args=(addr, 3))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not blocked.current() and time.monotonic() < deadline:
            time.sleep(0.01)
        (entry,) = blocked.current()
        assert entry["addr"] == addr and entry["wants"] == 3 and entry["holds"] == 0
        assert entry["where"].startswith("threading.py:")  # the frame that called the wait
    finally:
        cell.value = 3
        t.join(5)
    assert not t.is_alive() and blocked.current() == []


def test_a_twin_wait_ends_with_the_liveness_watch_error():
    def watch(waited: float) -> None:
        if waited > 0.1:
            raise CollectiveTimeoutError("rank 1 never signalled")

    cell = ctypes.c_int32(0)
    liveness.set_watch(watch)
    try:
        with pytest.raises(CollectiveTimeoutError, match="never signalled"):
            hostmem.wait_at_least(ctypes.addressof(cell), 1)
    finally:
        liveness.set_watch(None)
        blocked.forget()
