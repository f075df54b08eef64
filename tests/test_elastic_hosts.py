"""Shrink across hosts: survivors on several hosts continue as a world across them.

Hosts are split on one machine (``COMMLAB_HOSTS``; members of another host are watched
through heartbeats in the store, as on real hosts) and the parent serves the store.
``tests/test_run_hosts.py`` does the same on simulated hosts under the launcher.
"""

from __future__ import annotations

import pytest

from commlab.runtime._kill_points import SHRINK_POINTS
from commlab.testing import run_world
from tests.conftest import assert_checks
from tests.test_faults import assert_nothing_left
from tests.worlds.elastic_ddp import ddp_shrink_world
from tests.worlds.elastic_hosts import (
    across_newcomer,
    dying_newcomer,
    grow_across_hosts_world,
    grow_meets_a_death_world,
    shrink_across_hosts_world,
)
from tests.worlds.elastic_step import N, member, replacement

PEER_TIMEOUT = 1.0
ENV = {"COMMLAB_TIMEOUT": "60", "COMMLAB_PEER_TIMEOUT": str(PEER_TIMEOUT),
       "COMMLAB_HOSTS": "2"}
SECTIONS = ("symmetric", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
            "broadcast", "barrier", "ag_gemm", "gemm_rs")


def _shrunk(tmp_path, world: int, victims: list[int], seed: int,
            peer_timeout: float = PEER_TIMEOUT, **later) -> list[dict]:
    res = run_world(shrink_across_hosts_world, world, kwargs={
        "victims": victims, "at": 2, "steps": 6, "seed": seed, "note_dir": str(tmp_path),
        **later}, timeout=300, env={**ENV, "COMMLAB_PEER_TIMEOUT": str(peer_timeout)},
        store="parent", allow_killed=True)
    dead = sorted(victims + ([later["later"]] if "later" in later else []))
    assert [i for i, r in enumerate(res) if r is None] == dead, res
    survivors = [r for r in res if r is not None]
    killed = min(float((tmp_path / f"killed{v}").read_text()) for v in victims)
    for r in survivors:
        r["kill_to_first_s"] = r["t_first"] - killed
        print(f"rank {r['start_rank']}: shrink {r['shrink_s']:.3f} s, kill to first correct "
              f"collective {r['kill_to_first_s']:.3f} s")
    assert_nothing_left([p for r in survivors for p in r["pids0"]])
    return survivors


def test_a_rank_lost_on_one_host_leaves_survivors_on_both_hosts_one_world(tmp_path, seed):
    """2 hosts x 2 ranks, rank 3 (host 1) SIGKILLed mid-training: ranks 0, 1 (host 0) and
    2 (host 1) get RankLostError naming it, shrink to a world of 3 across the 2 hosts
    (hosts [[0, 1], [2]]), keep their symmetric tensors' contents, and every collective
    matches gloo in the new world."""
    survivors = _shrunk(tmp_path, 4, [3], seed)
    for new_rank, r in enumerate(survivors):
        assert r["lost"] == [[3]], r["lost"]
        assert (r["rank"], r["world_size"], r["generation"]) == (new_rank, 3, 1), r
        assert r["hosts"] == [[0, 1], [2]], r["hosts"]
        assert r["local"] == ([new_rank, 2] if new_rank < 2 else [0, 1]), r["local"]
        assert r["local_ctx"] == r["local"]  # what kernels see: the host's new numbering
        assert r["kept"] == [100.0 * r["start_rank"] + i for i in range(6)], r["kept"]
        assert all(ok for _, _, ok in r["steps"]) and r["steps"][-1][:2] == [5, 3], r
        assert r["kill_to_first_s"] < 2 * PEER_TIMEOUT + 1, r  # ~0.25 s here
    for section in SECTIONS:
        assert_checks(survivors, section)


def test_survivors_on_three_hosts_of_different_sizes_shrink_and_match_gloo(tmp_path, seed):
    """3 hosts x 2 ranks; ranks 1 (host 0) and 4 (host 2) die: hosts [[0], [1, 2], [3]]
    after the shrink, where the rank of a one-rank host stands in for the local index
    its host lacks. (A peer timeout of 3 s: 6 ranks on 2 cores starve a heartbeat thread
    for over 1 s at times, and a live member is then taken as lost.)"""
    survivors = _shrunk(tmp_path, 6, [1, 4], seed, peer_timeout=3.0)
    for new_rank, r in enumerate(survivors):
        assert sorted(sum(r["lost"], [])) in ([1, 4], [1], [4]), r["lost"]
        assert (r["rank"], r["world_size"]) == (new_rank, 4), r
        assert r["hosts"] == [[0], [1, 2], [3]], r["hosts"]
        assert r["kept"] == [100.0 * r["start_rank"] + i for i in range(6)], r["kept"]
    for section in SECTIONS:
        assert_checks(survivors, section)


def test_a_second_loss_shrinks_the_uneven_world_again(tmp_path, seed):
    """2 hosts x 2 ranks: rank 3 dies (hosts [[0, 1], [2]]), then rank 1 (host 0): the
    survivors, ranks 0 and 2 at start, shrink again to one rank per host and match gloo."""
    survivors = _shrunk(tmp_path, 4, [3], seed, later=1, later_at=4)
    for new_rank, r in enumerate(survivors):
        assert r["lost"] == [[3], [1]], r["lost"]  # rank 1 of the world of 3
        assert (r["rank"], r["world_size"], r["generation"]) == (new_rank, 2, 2), r
        assert r["hosts"] == [[0], [1]] and r["local"] == [0, 1], r
        assert r["kept"] == [100.0 * r["start_rank"] + i for i in range(6)], r["kept"]
        assert [w for _, w, _ in r["steps"]] == [4, 4, 3, 3, 2, 2], r["steps"]
        assert all(ok for _, _, ok in r["steps"]), r["steps"]
    for section in SECTIONS:
        assert_checks(survivors, section)


def test_a_newcomer_joins_a_world_across_hosts_after_a_shrink(seed):
    """2 hosts x 2 ranks; rank 3 dies and the survivors shrink to [[0, 1], [2]]; a
    newcomer in commlab.init(join=True) is admitted by commlab.grow(1) as rank 3 on the
    host that lost one (the smaller: hosts split on one machine share /dev/shm) and
    every collective of the world of 4 matches gloo."""
    res = run_world(grow_across_hosts_world, 4, kwargs={"note_dir": "", "seed": seed},
                    timeout=300, env=ENV, store="parent", allow_killed=True,
                    newcomers=[(across_newcomer, {"seed": seed})])
    assert res[3] is None, res
    grown = [r for r in res if r is not None]
    print("grow took", [round(r.get("grow_s", 0), 3) for r in grown[:3]], "s; checks ran",
          [sum(r["ran"].values()) for r in grown])
    assert [r["rank"] for r in grown] == [0, 1, 2, 3], grown
    for r in grown:
        assert r["world_size"] == 4 and r["hosts"] == [[0, 1], [2, 3]], r
        assert r["generation"] == 2, r
    assert [r["local"] for r in grown] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    for section in ("symmetric", "all_gather", "reduce_scatter", "all_to_all",
                    "broadcast", "barrier", "ag_gemm", "gemm_rs"):
        assert_checks(grown, section)
    assert_nothing_left([r["pid"] for r in grown])


def test_ddp_on_the_commlab_backend_goes_on_across_hosts_after_a_shrink(tmp_path):
    """torch.distributed on "commlab" over 2 hosts x 2 ranks, DDP training; rank 3 dies:
    the survivors' backward raises RankLostError, shrink remakes the default group over
    the 3 ranks on 2 hosts, DDP wrapped again goes on with the right gradients."""
    res = run_world(ddp_shrink_world, 4, kwargs={"note_dir": str(tmp_path), "victim": 3,
                    "kill_step": 3, "steps": 6}, timeout=240, init=False, store="parent",
                    allow_killed=True, env=ENV)
    assert res[3] is None
    for new_rank, r in enumerate(res[:3]):
        assert [e["lost_error"] for e in r["errors"]] == [True], r["errors"]
        assert "rank 3 of 4 was lost" in r["errors"][0]["text"], r["errors"]
        assert r["after"] == {"rank": new_rank, "world": 3, "comm_rank": new_rank}
        assert [s["world"] for s in r["steps"]] == [4, 4, 4, 3, 3, 3], r["steps"]
        assert all(s["ok"] for s in r["steps"]), r["steps"]
        assert r["members"] == [0, 1, 2]


@pytest.mark.parametrize("point", SHRINK_POINTS)
def test_a_rank_dying_at_each_point_of_a_shrink_across_hosts_leaves_one_world(
        tmp_path, seed, point):
    """2 hosts x 2 ranks: rank 3 dies, and rank 1 dies at ``point`` of the survivors'
    shrink; ranks 0 and 2 end in one world of one rank per host, generation as many
    shrinks as it took, every collective matching gloo."""
    survivors = _shrunk(tmp_path, 4, [3], seed, later=1, point=point)
    print(point, "lost", survivors[0]["lost"], "generation", survivors[0]["generation"])
    for new_rank, r in enumerate(survivors):
        assert (r["rank"], r["world_size"], r["hosts"]) == (new_rank, 2, [[0], [1]]), r
        assert r["generation"] == survivors[0]["generation"] >= 1, r
        assert r["kept"] == [100.0 * r["start_rank"] + i for i in range(6)], r["kept"]
        assert all(ok for _, _, ok in r["steps"]) and r["steps"][-1][:2] == [5, 2], r
    for section in SECTIONS:
        assert_checks(survivors, section)


def test_elastic_step_across_hosts_rolls_back_a_loss_and_admits_a_replacement(tmp_path):
    """commlab.elastic.step on 2 hosts x 2 ranks: rank 2 (host 1) dies at step 5, the
    survivors roll back and shrink across both hosts, the replacement waiting beside
    them joins host 1 and receives the state; each sample is seen once."""
    d = str(tmp_path)
    res = run_world(member, 4, kwargs={"note_dir": d, "kill": ("m2", 5)}, store="parent",
                    timeout=240, env=ENV, allow_killed=True,
                    newcomers=[(replacement, {"note_dir": d})])
    assert res[2] is None
    live = [r for r in res if r is not None]
    assert sorted(r["rank"] for r in live) == [0, 1, 2, 3]
    for r in live:
        assert sorted(r["seen"]) == list(range(N)), r  # each sample once, none lost
        assert r["steps"] == len(r["worlds"]) and r["params_equal"], r
        assert r["worlds"] == live[0]["worlds"] and r["seen"] == live[0]["seen"]
    worlds = live[0]["worlds"]
    assert worlds[:5] == [4] * 5 and 3 in worlds and worlds[-1] == 4, worlds


@pytest.mark.parametrize("point", ["join.map", "grow.ready", "join.commit", "grow.commit"])
def test_a_death_during_a_grow_across_hosts_fails_it_alike_and_leaves_nothing(
        tmp_path, point):
    """After a shrink to [[0, 1], [2]], grow(1) meets the newcomer dying with its heap
    published (join.map: the grow fails, the 3 go on) or while the grown world connects
    (join.commit: RankLostError, shrink back to the 3), or rank 1 dying before its ready
    (grow.ready: RankLostError, the newcomer is refused, ranks 0 and 2 shrink to one per
    host) or while the grown world connects (grow.commit: ranks 0, 2 and the newcomer
    shrink the grown world to [[0], [1, 2]]); no process or /dev/shm segment is left,
    the dead's included."""
    d = {"point": point, "note_dir": str(tmp_path)}
    res = run_world(grow_meets_a_death_world, 4, kwargs=d, timeout=240, env=ENV,
                    store="parent", allow_killed=True, newcomers=[(dying_newcomer, d)])
    live = [r for r in res if r is not None and "ok" in r]
    want = {"join.map": ([0, 1, 2], [[0, 1], [2]], "CommlabError"),
            "join.commit": ([0, 1, 2], [[0, 1], [2]], "RankLostError"),
            "grow.ready": ([0, 2], [[0], [1]], "RankLostError"),
            "grow.commit": ([0, 2, None], [[0], [1, 2]], "RankLostError")}[point]
    assert [r["start_rank"] for r in live] == want[0], res
    for r in live:
        assert r["hosts"] == want[1] and r["ok"], r
        if r["start_rank"] is not None:
            assert r["grow"].startswith(want[2]), r["grow"]
    if point == "grow.ready":
        assert res[4]["join"].startswith("CommlabError") and "failed" in res[4]["join"]
    if point == "join.map":
        assert all("died during the grow" in r["grow"] for r in live), live
    pids = [int(p.name[3:]) for p in tmp_path.glob("pid*")]
    assert len(pids) == 5
    assert_nothing_left(pids)
