"""The pipelined push kernels, with GPU-like launch shapes, on the CPU backend."""

from __future__ import annotations

import pytest

from tests.worlds import pipelines


@pytest.mark.parametrize("world_size,rounds", [(3, 3)])
def test_pipelined_kernels_match_gloo_with_many_programs_and_rounds(world, seed, world_size,
                                                                     rounds):
    checked = world(pipelines.run, world_size, seed, env={"COMMLAB_ROUNDS": str(rounds)})
    assert checked == [42] * world_size
