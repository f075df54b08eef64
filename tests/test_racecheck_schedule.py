"""Schedule exploration: racecheck(shuffle=True, seed=N) runs a launch's programs in
orders drawn from the seed, so an order-dependent deadlock and a lost update surface,
and the seed a report names replays it; a program waiting for a later program of its
launch ends on the CPU backend as on a GPU."""

from __future__ import annotations

import pytest

from commlab.testing import run_world
from tests.worlds.racecheck_schedule import schedule_world


@pytest.fixture(scope="module")
def explored():
    return run_world(schedule_world, 2, timeout=300, env={"COMMLAB_TIMEOUT": "60"})


def test_the_default_order_passes_the_kernel_some_seeds_deadlock(explored):
    for r in explored:
        assert r["plain"] == "", r["plain"]
        assert r["bad"] is not None and r["good"] is not None, r["hung"]


def test_a_deadlocking_seed_is_named_and_deadlocks_again(explored):
    for r in explored:
        text = r["hung"][r["bad"]]
        assert f"shuffle seed {r['bad']}" in text and "Wait-for graph" in text
        assert f"racecheck(shuffle=True, seed={r['bad']})" in text
        assert r["again"][r["bad"]], "the failing seed did not deadlock again"
        assert r["again"][r["good"]] == "", "a passing seed deadlocked when replayed"


def test_a_seed_draws_the_same_schedule_on_every_rank(explored):
    assert len({(r["bad"], r["good"]) for r in explored}) == 1


def test_a_lost_update_surfaces_as_a_race_naming_the_seed(explored):
    for r in explored:
        values = {v for v, _ in r["counts"].values()}
        assert 1 in values, r["counts"]  # some interleaving lost an update
        for seed, (_, text) in r["counts"].items():
            assert "Programs 0 and 1 of one launch run concurrently" in text
            assert f"shuffle seed {seed}" in text


def test_a_wait_for_a_later_program_of_the_launch_ends_outside_racecheck(explored):
    for r in explored:
        assert r["later"] == 1 and r["usable"]


def test_a_failing_program_unwinds_the_one_waiting_for_it_and_its_error_is_raised(explored):
    for r in explored:
        assert "CommlabUsageError" in r["failed"] and "peer" in r["failed"], r["failed"]
        assert r["usable"]
