"""Newcomers enter a running world in place: ``commlab.init(join=True)`` on the newcomer,
``commlab.grow(n)`` on the members. Worlds whose store the parent serves (it outlives
every rank), newcomers started beside the ranks (``run_world(newcomers=...)``)."""

from __future__ import annotations

import os

from commlab.testing import run_world
from tests.test_faults import assert_nothing_left
from tests.worlds.elastic_grow import (
    doomed_newcomer,
    grow_member,
    grow_times_out,
    idle,
    lonely_newcomer,
    members_survive_a_dying_newcomer,
    newcomer,
)

ENV = {"COMMLAB_TIMEOUT": "60", "COMMLAB_PEER_TIMEOUT": "1"}


def _pids(note_dir) -> list[int]:
    return [int(open(os.path.join(note_dir, n)).read()) for n in os.listdir(note_dir)
            if n.startswith("pid")]


def _check_grown(res: list, size: int) -> None:
    assert sorted(r["rank"] for r in res) == list(range(size)), res
    for r in res:
        assert r["world"] == size and r["current"], r
        assert r["y_ok"] and r["z_ok"] and r["g_ok"], r
        assert r["step"] == 7, r  # the members' state reached the newcomers
    # a symmetric tensor of the old world and a fresh one: one offset on every rank
    assert len({r["kept_offset"] for r in res}) == 1 and res[0]["kept_offset"] is not None
    assert len({r["fresh_offset"] for r in res}) == 1 and res[0]["fresh_offset"] is not None


def test_a_newcomer_joins_as_rank_w_with_the_members_state_and_symmetric_tensors(tmp_path):
    res = run_world(grow_member, 3, kwargs={"note_dir": str(tmp_path)}, store="parent",
                    timeout=180, env=ENV, newcomers=[(newcomer, {"note_dir": str(tmp_path)})])
    _check_grown(res, 4)
    assert res[3]["rank"] == 3 and res[3]["received"] == res[0]["sent"] > 0
    assert all(r["generation"] == 1 for r in res) and all(r["old_closed"] for r in res[:3])
    print("join_s", res[3]["join_s"], "first_collective_s", res[3]["first_collective_s"],
          "bytes", res[0]["sent"])
    assert_nothing_left([r["pid"] for r in res])


def test_two_newcomers_are_admitted_together_as_ranks_2_and_3(tmp_path):
    d = str(tmp_path)
    res = run_world(grow_member, 2, kwargs={"note_dir": d, "n": 2}, store="parent",
                    timeout=180, env=ENV,
                    newcomers=[(newcomer, {"note_dir": d}), (newcomer, {"note_dir": d})])
    _check_grown(res, 4)
    assert sorted(r["rank"] for r in res[2:]) == [2, 3]
    assert_nothing_left([r["pid"] for r in res])


def test_a_replacement_joins_after_a_shrink_and_the_world_is_4_again(tmp_path):
    d = str(tmp_path)
    res = run_world(grow_member, 4, kwargs={"note_dir": d, "kill": 2}, store="parent",
                    timeout=180, env=ENV, allow_killed=True,
                    newcomers=[(newcomer, {"note_dir": d, "wait_for": "shrunk"})])
    assert res[2] is None
    live = [r for r in res if r is not None]
    _check_grown(live, 4)
    assert all(r["generation"] == 2 for r in live)  # one shrink, one grow
    assert res[4]["rank"] == 3
    assert_nothing_left(_pids(d))


def test_grow_with_no_newcomer_fails_alike_and_the_world_goes_on_unchanged():
    res = run_world(grow_times_out, 3, store="parent", timeout=120, env=ENV)
    for r in res:
        assert "1 of 1 newcomers" not in r["err"] and "0 of 1 newcomers registered within " \
            "1 s" in r["err"] and "continues unchanged with its 3 ranks" in r["err"], r
        assert r["ok"] and r["same"] and r["waited"] < 10, r


def test_a_newcomer_nobody_admits_gets_a_clear_error_after_its_timeout():
    res = run_world(idle, 1, store="parent", timeout=120, env=ENV,
                    newcomers=[(lonely_newcomer, {})])
    err = res[1]["err"]
    assert err.startswith("CollectiveTimeoutError") and "not admitted within 1 s" in err
    assert "commlab.grow(n)" in err and res[1]["waited"] < 10


def test_a_newcomer_dying_in_the_grow_never_hangs_the_members(tmp_path):
    for delay in (0.0, 0.02):
        res = run_world(members_survive_a_dying_newcomer, 3, store="parent", timeout=180,
                        env=ENV, allow_killed=True,
                        newcomers=[(doomed_newcomer, {"note_dir": str(tmp_path),
                                                      "delay": delay})])
        assert res[3] is None
        for r in res[:3]:
            print(delay, r["outcome"][:200])
            assert r["world"] == 3 and r["ok"] and r["z_ok"], r
