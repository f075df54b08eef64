"""The standing fault suite: bad inputs on one rank and on all, a stopped-then-continued
rank, a killed rank, a few hundred mixed collectives with stragglers checked against
gloo, allocation loops under GC pressure; and nothing left behind (no /dev/shm segment of
the world's ranks, no rank process)."""

from __future__ import annotations

import os
import time

import pytest

from commlab.testing import WorldError, run_world
from tests.conftest import assert_checks
from tests.worlds.faults import fault_suite_world, finished_rank_world, killed_rank_world

ENV = {"COMMLAB_TIMEOUT": "60"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def assert_nothing_left(pids: list[int], wait: float = 10.0) -> None:
    """No rank process alive within ``wait``, and then no /dev/shm segment any of them
    created. Segments are looked at once, when the last process is gone: waiting longer
    would let another world's ``sweep_orphans`` remove a leaked one unseen."""
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not alive, f"rank processes still alive: {alive}"
    segs = [n for n in os.listdir("/dev/shm") if n.startswith("commlab-")
            and any(n.endswith(f"-p{p}") for p in pids)]
    assert not segs, f"/dev/shm segments left: {segs}"


@pytest.fixture(scope="module")
def suite():
    res = run_world(fault_suite_world, 2, timeout=300, env=ENV)
    assert_nothing_left([r["pid"] for r in res])
    return res


SECTIONS = {
    "bad_inputs": "a bad input on one rank or on all raises the same error everywhere, in step",
    "stopped_rank": "a rank stopped with SIGSTOP and continued joins the next collective",
    "stragglers": "mixed collectives with random stragglers match gloo",
    "gc_pressure": "allocation loops with cyclic garbage and rank-dependent work stay in step",
}


@pytest.mark.parametrize("section", list(SECTIONS), ids=list(SECTIONS))
def test_fault_suite_section_holds_and_leaves_nothing_behind(suite, section):
    assert_checks(suite, section)


def test_a_rank_killed_inside_a_kernel_wait_is_named_within_seconds_and_leaves_nothing(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(WorldError) as ei:
        run_world(killed_rank_world, 2, kwargs={"note_dir": str(tmp_path)}, timeout=120,
                  env=ENV)
    took = time.monotonic() - t0
    f = ei.value.failures
    assert "died" in f[1], f
    # the survivor's kernel wait raised, naming the dead rank, long before COMMLAB_TIMEOUT
    assert "RankLostError" in f[0] and "rank 1 of 2 was lost" in f[0], f
    assert took < 50, took
    pids = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    assert_nothing_left(pids)


def test_a_rank_that_finished_and_exited_does_not_fail_a_wait_still_served_by_another():
    got = run_world(finished_rank_world, 3, kwargs={"signals": True}, timeout=120, env=ENV)
    assert got[1] == {"rank 2 gone first": True}, got
    assert got[0]["flag"] == 2 and got[0]["waited"] > 0.5, got


def test_a_wait_for_a_signal_a_closed_rank_never_sent_times_out_naming_where_it_closed():
    with pytest.raises(WorldError) as ei:
        run_world(finished_rank_world, 3, kwargs={"signals": False}, timeout=120,
                  env={"COMMLAB_TIMEOUT": "3"})
    f = ei.value.failures
    assert list(f) == [0], f
    assert "CollectiveTimeoutError" in f[0] and "3 s timeout" in f[0], f[0]
    assert "rank 2 closed its communicator after call #" in f[0], f[0]
