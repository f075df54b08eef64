"""The "commlab" torch.distributed backend against gloo on worlds of 2, 3 and 4 CPU
ranks (tests/worlds/torch_backend.py)."""

from __future__ import annotations

import pytest

from tests.conftest import assert_checks
from tests.worlds import torch_backend as tb

WORLDS = [2, 3, 4]


@pytest.fixture(scope="module")
def results():
    import secrets

    from commlab.testing import WorldError, run_world

    cache: dict[int, object] = {}

    def get(world_size: int) -> list:
        if world_size not in cache:
            try:
                cache[world_size] = run_world(
                    tb.collectives_world, world_size, args=(secrets.randbelow(1 << 30),),
                    timeout=300, env={"COMMLAB_TIMEOUT": "60"}, init=False)
            except WorldError as e:
                cache[world_size] = e
        if isinstance(cache[world_size], WorldError):
            pytest.fail(str(cache[world_size]), pytrace=False)
        return cache[world_size]

    return get


SECTIONS = ["all_reduce", "all_gather_into_tensor", "all_gather", "broadcast",
            "all_to_all_single", "reduce_scatter_tensor", "reduce_scatter", "coalesced",
            "async", "barrier", "fallback", "groups", "init", "trace"]


@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.parametrize("section", SECTIONS)
def test_dist_ops_through_commlab_match_gloo(results, world_size, section):
    assert_checks(results(world_size), section)


@pytest.mark.parametrize("world_size", [2, 3])
def test_mismatched_sizes_and_dtypes_raise_commlab_error_on_every_rank(world, world_size):
    results = world(tb.mismatch_world, world_size, init=False)
    for r, res in enumerate(results):
        for name, etype, msg in res["errors"]:
            assert etype == "RankMismatchError", f"rank {r}, {name}: {etype}: {msg}"
        assert res["after"] == [world_size * (world_size + 1) / 2] * 8  # world still usable
    shapes = [m for n, _, m in results[0]["errors"] if n == "shape"][0]
    assert "shape differs across ranks" in shapes, shapes
    sizes = [m for n, _, m in results[0]["errors"] if n == "output size"][0]
    assert f"rank {world_size - 1}" in sizes and "size the output" in sizes, sizes
