"""commlab.racecheck on the CPU backend: planted races are named (both accesses, ranks,
kernel lines, what ordering is missing), their fixes pass, a deadlock under wait_timeout
raises WaitTimeoutError with the wait-for graph, and commlab's collectives and both
overlap kernels pass on 2 and 3 ranks over repeated calls."""

from __future__ import annotations

import pytest

from commlab.testing import run_world
from tests.worlds.racecheck import collectives_world, deadlock_world, planted_world

ENV = {"COMMLAB_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def planted():
    res = run_world(planted_world, 2, timeout=300, env=ENV)
    for r in res:
        assert not r["failures"], r["failures"]
    return [r["found"] for r in res]


def _texts(planted, case):
    return [f[case] for f in planted if f[case]]


def test_a_load_before_the_wait_is_a_race_naming_both_accesses(planted):
    texts = _texts(planted, "load_before_wait")
    assert texts, "no rank reported the race"
    t = texts[0]
    assert "rank 1 program 0 (push_kernel, racecheck.py:" in t
    assert "rank 0 program 0 (push_kernel, racecheck.py:" in t
    assert "loaded it" in t and "stored to it" in t
    assert "the symmetric tensor at heap offset" in t and "on rank 1, bytes 0..255" in t
    assert "rank 1 loaded it before any wait that follows rank 0's notify" in t


def test_waiting_for_a_value_already_there_is_a_race(planted):
    texts = _texts(planted, "already_there")
    assert texts and "value already there" in texts[0]
    assert "rank 1 loaded it before any wait that follows rank 0's notify" in texts[0]


def test_reusing_a_buffer_before_the_peer_read_it_is_a_race(planted):
    texts = _texts(planted, "reuse")
    assert texts and "rank 0 stored it before any wait that follows rank 1's notify" in texts[0]


def test_two_programs_of_one_launch_writing_the_same_bytes_race(planted):
    texts = _texts(planted, "two_programs")
    assert texts and "Programs 0 and 1 of one launch run concurrently" in texts[0]
    assert "stored to it" in texts[0]


@pytest.mark.parametrize("case", ["load_after_wait", "rounds_ok", "two_programs_ok"])
def test_the_fixed_kernels_pass(planted, case):
    assert not _texts(planted, case), _texts(planted, case)


@pytest.fixture(scope="module")
def deadlocks():
    return run_world(deadlock_world, 2, timeout=300, env=ENV)


def test_a_deadlock_raises_wait_timeout_with_the_wait_for_graph_and_the_world_recovers(
        deadlocks):
    for r in deadlocks:
        t = r["text"]
        assert "Wait-for graph" in t and r["usable"]
        assert "rank 0 program 0 at racecheck.py:" in t and "rank 1 program 0 at" in t
        assert "for 1 and holds 0" in t
        assert "no rank has notified it yet; rank 1, the only other rank, could notify" in t
        assert "Cycle: rank 0 -> rank 1 -> rank 0" in t
        assert r["cycle"] == [0, 1, 0]
        assert [(n["rank"], n["wants"], n["holds"]) for n in r["graph"]] == [(0, 1, 0), (1, 1, 0)]


def test_the_wait_for_graph_names_each_blocked_program_and_its_own_flag(deadlocks):
    for r in deadlocks:
        g = r["per_program"]
        assert g, "no WaitTimeoutError"
        got = sorted((n["rank"], n["program"], n["flag_offset"] - g["graph"][0]["flag_offset"])
                     for n in g["graph"])
        assert got == [(0, 0, 0), (0, 1, 4), (1, 0, 0), (1, 1, 4)], g["graph"]
        assert all(n["where"].startswith("racecheck.py:") and n["wants"] == 1
                   and n["holds"] == 0 for n in g["graph"])
        assert "rank 1 program 1 at racecheck.py:" in g["text"]
        assert "int32 [1] of the symmetric tensor at" in g["text"]
        assert "Cycle: rank 0 -> rank 1 -> rank 0 (rank 0 program 0 -> rank 1 program 0" \
            in g["text"]
        assert len(g["cycle_nodes"]) == 3 and g["cycle"] == [0, 1, 0]


def test_a_wait_for_a_later_program_of_the_same_launch_ends_as_on_a_gpu(deadlocks):
    for r in deadlocks:
        assert r["later"] == "" and r["later_flag"] == 1, r["later"]


@pytest.mark.parametrize("world", [2, 3])
def test_commlab_collectives_and_overlap_kernels_pass_racecheck(world):
    res = run_world(collectives_world, world, timeout=600, env=ENV)
    for r in res:
        assert not r["failures"], r["failures"]
        assert r["launches"] > 20 and r["accesses"] > 100, r
