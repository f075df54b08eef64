"""Groups connected in a watched thread (``commlab/runtime/_watched_groups.py``): what
the caller registers is what torch's ``init_process_group`` and ``new_group`` register,
and an attempt given up registers nothing, however late its thread finishes."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from commlab.runtime import _watched_groups
from commlab.testing import run_world
from tests.worlds.regroup import registered_like_torch_world


@pytest.mark.parametrize("backend, legacy", [("gloo", False), ("gloo", True),
                                              ("commlab", False)],
                         ids=["gloo", "gloo_without_register_pg_in_world", "commlab"])
def test_groups_built_in_the_thread_are_registered_as_torch_registers_its_own(backend,
                                                                              legacy):
    res = run_world(registered_like_torch_world, 2, init=False, store="parent", timeout=120,
                    kwargs={"backend": backend, "legacy": legacy})
    for r in res:
        assert r["ours"]["registry"] == r["torch"]["registry"], r
        assert r["ours"]["default_is_first"], r
        assert r["ours"]["use"] == r["torch"]["use"], r
    assert res[0]["ours"]["use"][:2] == [[3.0] * 3, [3.0] * 3], res  # sums over both ranks


def test_a_given_up_attempt_registers_nothing_and_its_groups_are_shut_down(monkeypatch):
    shut: list = []
    monkeypatch.setattr(_watched_groups, "_shutdown", lambda groups: shut.extend(groups))
    assert not dist.is_initialized()
    attempt = _watched_groups.Attempt(dist.HashStore(), 0, 1, timedelta(seconds=10))
    first = attempt.default("gloo")  # one rank: gloo connects at once
    attempt.give_up()  # the watch gave up while the thread went on
    assert shut == []  # the thread still runs: it shuts its groups down as it ends
    with pytest.raises(_watched_groups.GivenUp):
        attempt.new_group([0])  # it builds nothing more
    attempt.ended()
    assert shut == [first]
    assert not dist.is_initialized() and not dist.distributed_c10d._world.pg_names

    late = _watched_groups.Attempt(dist.HashStore(), 0, 1, timedelta(seconds=10))
    built = late.default("gloo")
    late.ended()  # the thread finished first, then the watch gave up
    late.give_up()
    assert shut == [first, built] and not dist.is_initialized()
