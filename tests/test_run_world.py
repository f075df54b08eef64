"""``commlab.testing.run_world``: CPU ranks forked from the fork server see the caller's
environment and working directory as spawned ranks do."""

from __future__ import annotations

import os

import pytest

from commlab.testing import run_world
from tests.worlds import run_world_env


@pytest.mark.parametrize("start", ["auto", "spawn"])
def test_ranks_see_the_callers_environment_and_directory_at_the_call(start, tmp_path,
                                                                      monkeypatch):
    if start == "auto":  # the fork server is up before the caller's change
        run_world(run_world_env.seen, 2, args=("RUN_WORLD_TEST_MARK",), start=start)
    monkeypatch.setenv("RUN_WORLD_TEST_MARK", f"set after the first world ({start})")
    monkeypatch.chdir(tmp_path)
    out = run_world(run_world_env.seen, 2, args=("RUN_WORLD_TEST_MARK",), start=start)
    assert [r["value"] for r in out] == [f"set after the first world ({start})"] * 2
    assert [r["cwd"] for r in out] == [str(tmp_path)] * 2
    assert [r["sum"] for r in out] == [[2.0] * 4] * 2 and [r["rank"] for r in out] == [0, 1]
    forked = {r["ppid"] for r in out} != {os.getpid()}  # the fork server is their parent
    assert forked == (start == "auto")


def test_a_fork_server_for_a_gpu_world_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="start='spawn'"):
        run_world(run_world_env.seen, 2, args=("X",), backend="cuda", start="forkserver")


def test_a_world_that_changes_a_setting_read_at_import_is_spawned_and_sees_it():
    default = run_world(run_world_env.records_on, 2)
    off = run_world(run_world_env.records_on, 2, env={"COMMLAB_RECORDS": "0"})
    assert [(r["host"], r["kernels"]) for r in default] == [(True, True)] * 2
    assert [(r["host"], r["kernels"]) for r in off] == [(False, False)] * 2
    assert {r["ppid"] for r in off} == {os.getpid()}  # spawned: the server's import is older
    assert {r["ppid"] for r in default} != {os.getpid()}
    with pytest.raises(ValueError, match="COMMLAB_RECORDS"):
        run_world(run_world_env.records_on, 2, env={"COMMLAB_RECORDS": "0"},
                  start="forkserver")


def test_the_rank_serving_the_store_stays_until_its_peers_read_their_last_share():
    # rank 0 returns (and finalizes) right after its last set; rank 1 reads 1.5 s later:
    # the store must still be served then (CI once saw "Connection reset by peer" here)
    out = run_world(run_world_env.last_share_read_late, 2, args=(1.5,))
    assert [r["value"] for r in out] == ["from rank 0"] * 2
