"""Settings that shape the heap or the protocol are agreed at init (the same error on
every rank, naming the setting and each rank's value, and the world stays usable); a
local error such as a full heap is raised with one type and message everywhere."""

from __future__ import annotations

from commlab.runtime._settings import differences
from tests.worlds.init_settings import differing_env, differing_scratch, heap_full_on_one_rank


def test_a_scratch_size_that_differs_is_refused_on_every_rank_before_any_collective(world):
    out = world(differing_scratch, 3, init=False)
    firsts = {r["first"] for r in out}
    assert len(firsts) == 1, firsts  # the same error on every rank
    msg = firsts.pop()
    assert msg.startswith("CommlabUsageError: commlab.init: scratch_size differs across ranks")
    assert "ranks 0, 2: 4194304" in msg and "rank 1: 8388608" in msg, msg
    assert "pass the same init arguments" in msg
    assert all(r["sum"] == [3.0, 3.0, 3.0] for r in out), out  # init again works


def test_an_environment_setting_that_differs_is_named_with_why_it_matters(world):
    out = world(differing_env, 3, init=False)
    assert len(set(out)) == 1, out
    assert "COMMLAB_ROUNDS (the collectives' pipeline depth) differs across ranks " \
           "(ranks 0, 1: None, rank 2: '4')" in out[0], out[0]


def test_a_heap_full_on_one_rank_raises_heap_full_error_with_one_message_everywhere(world):
    out = world(heap_full_on_one_rank, 2)
    assert len(set(out)) == 1, out
    assert out[0].startswith("HeapFullError: symmetric_empty: on rank 1: symmetric heap full")


def test_differences_lists_every_setting_that_differs_and_nothing_else():
    same = {"heap_size": 1, "COMMLAB_ROUNDS": None}
    assert differences([same, dict(same), dict(same)]) == []
    diffs = differences([same, {"heap_size": 2, "COMMLAB_ROUNDS": "2"}, same])
    assert diffs == ["heap_size differs across ranks (ranks 0, 2: 1, rank 1: 2)",
                     "COMMLAB_ROUNDS (the collectives' pipeline depth) differs across ranks "
                     "(ranks 0, 2: None, rank 1: '2')"]
