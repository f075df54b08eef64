"""The worked example examples/ring_all_gather.py against torch.distributed, on 2, 3
and 4 ranks, repeated calls included (its signals only grow: no reset between calls)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))  # spawned ranks inherit sys.path

import ring_all_gather as example  # noqa: E402


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_gather_example_matches_torch_distributed_over_repeated_calls(
        world, world_size):
    results = world(example.check_against_torch_distributed, world_size, (1, 1037), 2)
    problems = [p for rank_problems in results for p in rank_problems]
    assert not problems, "\n".join(problems)
