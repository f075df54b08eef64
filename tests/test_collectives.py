"""Every collective against torch.distributed (gloo) on worlds of 2, 3 and 4 CPU ranks.

One world per size runs all the checks (tests/worlds/collectives.py); the tests below
each assert on their own part of the results.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_checks
from tests.worlds.collectives import back_to_back_world, collectives_world

CHUNKED_N = 4_500_002  # 18 MB of float32: more than the 16 MiB CPU scratch


@pytest.fixture(scope="module")
def results(request):
    """Per world size, the results of collectives_world (started on first use)."""
    import secrets

    from commlab.testing import WorldError, run_world

    cache: dict[int, list] = {}

    def get(world_size: int) -> list:
        if world_size not in cache:
            seed = secrets.randbelow(1 << 30)
            chunked = CHUNKED_N if world_size == 2 else 0  # once, on the cheapest world
            try:
                cache[world_size] = run_world(collectives_world, world_size,
                                              args=(seed, chunked), timeout=240,
                                              env={"COMMLAB_TIMEOUT": "60"})
            except WorldError as e:
                cache[world_size] = e
        if isinstance(cache[world_size], WorldError):
            pytest.fail(str(cache[world_size]), pytrace=False)
        return cache[world_size]

    return get


WORLDS = [2, 3, 4]


@pytest.mark.parametrize("world_size", WORLDS)
def test_all_reduce_matches_gloo_for_every_op_algorithm_and_dtype(results, world_size):
    assert_checks(results(world_size), "all_reduce")


@pytest.mark.parametrize("world_size", WORLDS)
def test_all_reduce_gives_every_rank_bitwise_identical_results(results, world_size):
    assert_checks(results(world_size), "all_reduce_identical")


@pytest.mark.parametrize("world_size", WORLDS)
def test_all_gather_matches_gloo(results, world_size):
    assert_checks(results(world_size), "all_gather")


def test_copy_engine_exchanges_keep_their_state_in_the_flag_area(results):
    assert_checks(results(2), "copy_engine_state")


@pytest.mark.parametrize("world_size", WORLDS)
def test_reduce_scatter_matches_gloo_for_sum_max_min(results, world_size):
    assert_checks(results(world_size), "reduce_scatter")


@pytest.mark.parametrize("world_size", WORLDS)
def test_broadcast_from_every_source_matches_gloo(results, world_size):
    assert_checks(results(world_size), "broadcast")


@pytest.mark.parametrize("world_size", WORLDS)
def test_all_to_all_matches_gloo(results, world_size):
    assert_checks(results(world_size), "all_to_all")


@pytest.mark.parametrize("world_size", WORLDS)
def test_collectives_leave_their_inputs_unchanged(results, world_size):
    assert_checks(results(world_size), "inputs_unchanged")


@pytest.mark.parametrize("world_size", WORLDS)
def test_multi_dim_non_contiguous_zero_d_and_empty_inputs_work(results, world_size):
    assert_checks(results(world_size), "layouts")


@pytest.mark.parametrize("world_size", WORLDS)
def test_outputs_are_new_tensors_that_later_calls_leave_alone(results, world_size):
    assert_checks(results(world_size), "outputs_are_new")


@pytest.mark.parametrize("world_size", WORLDS)
def test_barrier_releases_no_rank_before_the_last_arrives(results, world_size):
    assert_checks(results(world_size), "barrier")


def test_inputs_larger_than_the_scratch_are_moved_in_chunks(results):
    assert_checks(results(2), "chunked")


def test_210_back_to_back_collectives_of_varying_sizes_are_all_correct(world, seed):
    # a small scratch (256 KiB) makes many of the calls chunked as well
    res = world(back_to_back_world, 3, seed, 210, env={"COMMLAB_SCRATCH_SIZE": "256KiB"})
    assert res[0]["calls"] == 210
    assert_checks(res, "back_to_back")
