"""Racecheck does not depend on timing: a ``cl.wait`` whose condition a value already in
the flag meets synchronises with that value's write, not with the peer's later notify,
so the load after it races with the peer's store on every run, whether the waiter looked
before or after the notify landed; waits for a value only the notify makes stay clean."""

from __future__ import annotations

import pytest

from commlab.testing import run_world
from tests.worlds.racecheck_present import CASES, DELAYS, present_world

ENV = {"COMMLAB_TIMEOUT": "60"}
RUNS = 20  # runs of 2 ranks with a random delay; every one must report the race


@pytest.fixture(scope="module")
def present():
    res = run_world(present_world, 2, kwargs={"runs": RUNS}, timeout=300, env=ENV)
    for r in res:
        assert not r["failures"], r["failures"]
    return [r["found"] for r in res]


def _reported(found, key) -> list[str]:
    return [f[key] for f in found if f[key]]


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if v[4]])
@pytest.mark.parametrize("delay", DELAYS)
def test_waiting_for_a_value_already_there_races_whatever_the_timing(present, case, delay):
    texts = _reported(present, f"{case}/{delay}")
    assert texts, f"{case}: no rank reported the race when {delay} was delayed"
    assert "rank 1 program 0 (present_kernel" in texts[0], texts[0]
    assert "rank 0 program 0 (present_kernel" in texts[0], texts[0]


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if not v[4]] + ["reset_ok"])
@pytest.mark.parametrize("delay", DELAYS)
def test_waiting_for_a_value_only_the_notify_makes_is_clean(present, case, delay):
    assert not _reported(present, f"{case}/{delay}"), _reported(present, f"{case}/{delay}")


def test_every_one_of_twenty_jittered_runs_reports_the_race(present):
    missed = [i for i in range(RUNS) if not _reported(present, f"runs/{i}")]
    assert not missed, f"runs {missed} of {RUNS} reported no race"
