"""Calls repeating an agreed plan skip the agreement's host barrier and are checked later:
they do not wait for slower ranks (up to the ring's depth), a mismatch found late raises
the same RankMismatchError on every rank by the next call or synchronize and the world
stays usable, and the calls whose safety needs the wait (first call of a plan, a plan
change, allocation, barrier, the switch off) still wait."""

from __future__ import annotations

import pytest

from commlab.testing import run_world
from tests.conftest import assert_checks
from tests.worlds.ahead import ahead_world


@pytest.fixture(scope="module")
def results():
    # a short timeout: a peer left without the kernel it waits for fails fast
    return run_world(ahead_world, 2, timeout=240, env={"COMMLAB_TIMEOUT": "30"})


def test_repeated_identical_calls_do_not_wait_and_stay_correct(results):
    assert_checks(results, "repeat")


def test_a_rank_runs_a_full_ring_of_calls_ahead_of_a_sleeping_peer_then_waits(results):
    assert_checks(results, "ring")


def test_a_plan_change_waits(results):
    assert_checks(results, "plan_change")


def test_an_allocation_waits_and_so_does_the_next_call(results):
    assert_checks(results, "allocation")


def test_barrier_waits_and_checks_every_call_that_ran_ahead(results):
    assert_checks(results, "barrier")


def test_with_the_switch_off_every_call_waits(results):
    assert_checks(results, "switch_off")


@pytest.mark.parametrize("section, needle", [
    ("late_op_value", "op differs across ranks (rank 0: sum, rank 1: max)"),
    ("late_collective", "different collectives (rank 0: all_reduce, rank 1: all_gather)"),
    ("late_shape", "shape differs across ranks (rank 0: (24,), rank 1: (5,))"),
])
def test_a_mismatch_found_late_raises_the_same_error_on_every_rank_and_the_next_call_works(
        results, section, needle):
    assert_checks(results, section)
    texts = {r["texts"].get(section) for r in results}
    assert len(texts) == 1, texts
    assert needle in texts.pop()
