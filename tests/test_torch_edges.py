"""What PyTorch's own distributed tests found on the "commlab" backend (tests/torch_suite),
each fixed at its root and checked here on CPU worlds (tests/worlds/torch_edges.py)."""

from __future__ import annotations

import time

import pytest

from commlab.testing import WorldError, run_world
from tests.worlds import torch_edges as te

ENV = {"COMMLAB_TIMEOUT": "60"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_empty_tensors_of_every_dtype_pass_every_collective_like_gloo(world, world_size):
    res = world(te.empty_world, world_size, init=False, timeout=300)
    for r, out in enumerate(res):
        assert not out["errors"], f"rank {r}: " + "\n".join(out["errors"][:2])
        for key, (commlab_shapes, gloo_shapes) in out["got"].items():
            assert commlab_shapes == gloo_shapes, (key, commlab_shapes, gloo_shapes)
        assert out["after"] == [world_size * (world_size + 1) / 2] * 5


def test_a_sparse_all_reduce_runs_on_the_fallback_and_matches_gloo(world):
    res = world(te.sparse_world, 2, init=False)
    for out in res:
        assert out["got"] == out["ref"] == [1.0, 1.0, 0.0, 1.0, 0.0], out
        assert out["routes"] == {"fallback:allreduce": 1}, out["routes"]


def test_every_way_into_all_reduce_sums_like_gloo_and_counts_one_kernel_call(world):
    for out in world(te.routes_world, 3, init=False):
        assert out["got"] == [out["ref"]] * 4 and out["done"] is True, out
        assert out["routes"] == {"kernel:allreduce": 3}, out["routes"]


def test_a_rank_missing_from_a_groups_collective_is_named_after_the_groups_timeout(world):
    out = world(te.missing_rank_world, 2, init=False, env=ENV)[0]
    for phase in ("build", "agreement"):  # the lazy build, then the agreement
        err, took = out[phase]
        assert err.startswith("CollectiveTimeoutError") and "rank 1 did not" in err, (phase, err)
        assert " 2 s timeout" in err, err  # torch's suite matches " timeout "
        assert 1.9 <= took < 15, (phase, took)
    assert out["after_build"] == [2.0] * 4


def test_a_dead_rank_is_named_by_the_agreement_within_seconds():
    t0 = time.monotonic()
    with pytest.raises(WorldError) as ei:
        run_world(te.dead_rank_world, 2, timeout=120, env=ENV, init=False)
    f = ei.value.failures
    assert "RankLostError" in f[0] and "rank 1 of 2 was lost" in f[0], f
    assert time.monotonic() - t0 < 45  # COMMLAB_TIMEOUT is 60


def test_monitored_barrier_behaves_as_the_readme_says(world):
    res = world(te.monitored_barrier_world, 3, init=False, env=ENV)
    assert "only implemented for GLOO" in res[0]["public"], res[0]
    assert "Rank 1 failed to pass monitoredBarrier" in res[0]["skipped"], res[0]


def test_every_collective_records_one_async_commlab_event_with_its_shapes(world):
    W = 2
    out = world(te.profiler_world, W, init=False)[0]
    shapes = {"all_gather_into_tensor": [[3, 4]], "reduce_scatter_tensor": [[W * 3, 4]],
              "all_to_all": [[W * 3, 4]], "barrier": [], "all_reduce_coalesced": [[3, 4], [2]]}
    for op, events in out.items():
        assert len(events) == 1, (op, events)
        is_async, count, got = events[0]
        assert is_async and count == 1, (op, events)
        assert got == shapes.get(op, [[3, 4]]), (op, got)


def test_a_torch_without_profiling_names_still_records_commlab_events(monkeypatch):
    """torch 2.11 (the GPU machines') lacks _set_comm_profiling_name: the event is a
    record_function range of the same name, and importing the backend does not fail."""
    import torch

    from commlab.torch_backend import _profile

    monkeypatch.setattr(_profile, "_set_comm_profiling_name", None)
    monkeypatch.setattr(_profile, "_get_comm_profiling_name", None)
    with torch.profiler.profile() as prof:
        _profile.record("commlab:all_reduce", [torch.zeros(3)])
        with _profile.titled("commlab:broadcast"):
            pass
    names = [e.name for e in prof.events()]
    assert names.count("commlab:all_reduce") == 1 and names.count("commlab:broadcast") == 1, names
