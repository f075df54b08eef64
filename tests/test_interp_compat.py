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
    # fails on Triton 3.6 without compat (its int(handle.data) under numpy 2); 3.9 squeezes
    n, out = torch.tensor([5], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _count_up[(1,)](n, out)
    assert int(out[0]) == 1 + 2 + 3 + 4


def test_every_launch_patches_index_with_the_one_element_rule():
    # the kernel test above cannot fail on a Triton whose interpreter squeezes itself
    # (3.9); this one fails on any release if compat is not what a launch installs
    import triton.runtime.interpreter as ti

    class Scope:
        def __init__(self):
            self.set = {}

        def set_attr(self, obj, name, value):
            self.set[name] = value
            setattr(obj, name, value)

    class Tensor:  # a stand-in class the scope patches (later patches read earlier ones)
        pass

    scope = Scope()
    ti._patch_lang_tensor(Tensor, scope)
    assert scope.set.get("__index__") is compat._index
