"""The symmetric heap: shapes and dtypes, equal offsets on every rank, freeing on garbage
collection, configurable sizes, init/finalize, and nothing left in /dev/shm."""

from __future__ import annotations

import pytest

from commlab.testing import WorldError, run_world
from tests.conftest import assert_checks, shm_files
from tests.worlds.heap import heap_world, killed_rank_world


@pytest.fixture(scope="module")
def results():
    return run_world(heap_world, 2, timeout=180, env={"COMMLAB_TIMEOUT": "60"})


def test_symmetric_empty_and_zeros_give_the_requested_shape_and_dtype(results):
    assert_checks(results, "shapes_dtypes")


def test_symmetric_tensors_sit_at_the_same_offset_on_every_rank(results):
    assert_checks(results, "same_offset")


def test_blocks_are_freed_on_garbage_collection_and_reused(results):
    assert_checks(results, "free_and_reuse")


def test_init_twice_returns_the_same_communicator(results):
    assert_checks(results, "init_twice")


def test_heap_and_scratch_sizes_are_configurable_by_argument_and_environment(results):
    assert_checks(results, "sizes")


def test_finalize_then_init_gives_a_working_world(results):
    assert_checks(results, "finalize_then_init")


def test_no_shared_memory_segments_remain_while_running_or_after_close(results):
    assert_checks(results, "no_shm_files")
    tokens = {t for r in results for t in r["tokens"]}
    assert len(tokens) == 3, tokens  # one per init; every rank agreed on each
    for token in tokens:
        assert shm_files(token) == [], f"left in /dev/shm: {shm_files(token)}"


def test_a_rank_killed_with_sigkill_leaves_no_segments_and_is_named(tmp_path):
    report = tmp_path / "report.txt"
    with pytest.raises(WorldError) as info:
        run_world(killed_rank_world, 2, args=(str(report),), timeout=120,
                  env={"COMMLAB_TIMEOUT": "3"})
    assert list(info.value.failures) == [1], info.value.failures
    assert "exit code -9" in info.value.failures[1]
    text = report.read_text()
    token = text.split("\n")[0].removeprefix("token=")
    assert "lost:" in text and "rank 1 of 2 was lost" in text, text
    assert shm_files(token) == [], f"left in /dev/shm: {shm_files(token)}"
