"""``commlab._interpreter.compat``: a loop bounded by a loaded value runs on every Triton
release's interpreter (3.6's ``int(handle.data)`` refused a one-element block under numpy 2)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import commlab  # noqa: F401 - turns the interpreter on (COMMLAB_BACKEND=cpu) and installs compat
from commlab._interpreter import compat


def test_a_one_element_block_is_an_index_and_a_longer_one_is_not():
    one = SimpleNamespace(handle=SimpleNamespace(data=np.array([7], dtype=np.int32)))
    assert compat._index(one) == 7 and type(compat._index(one)) is int
    several = SimpleNamespace(handle=SimpleNamespace(data=np.array([1, 2], dtype=np.int32)))
    with pytest.raises(TypeError):
        compat._index(several)


@triton.jit
def _count_up(n_ptr, out_ptr):
    n = tl.load(n_ptr)  # one element, as commlab's kernels load the world size
    acc = 0
    for i in range(1, n):
        acc += i
    tl.store(out_ptr, acc)


def test_a_kernel_loops_up_to_a_loaded_count():
    n, out = torch.tensor([5], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _count_up[(1,)](n, out)
    assert int(out[0]) == 1 + 2 + 3 + 4
