"""The interpreter fast path (commlab._interpreter.fastmem) gives the stock interpreter's bits.

Each kernel runs twice in this process, on the patched and on the stock builder, and
the outputs must be identical byte for byte: contiguous, strided, reversed and gathered
pointers; interval, lower-bounded and non-interval masks; `other` fills; int and float
dtypes; int32 index arithmetic that wraps around."""

from __future__ import annotations

import warnings

import pytest
import torch
import triton
import triton.language as tl

import commlab  # noqa: F401  (before the kernels: picks Triton's interpreter on CPU)
from commlab import _interpreter as _interpret
from commlab._interpreter import fastmem as _interp_fast
from commlab._interpreter import memory as _memory
from commlab._interpreter import selfcheck as _selfcheck

pytestmark = pytest.mark.skipif(not _interpret.interpreting(),
                                reason="the fast path patches Triton's interpreter (CPU backend)")

N, BLOCK = 1000, 256  # N not a multiple of BLOCK: the last block is masked


@triton.jit
def copy_kernel(x_ptr, out_ptr, N, OTHER: tl.constexpr, BLOCK: tl.constexpr):
    for start in range(0, N + BLOCK, BLOCK):  # one block entirely past the end
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=OTHER), mask=offs < N + 5)


@triton.jit
def window_kernel(x_ptr, out_ptr, LO, HI, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64) + 0
    mask = (offs >= LO) & (offs < HI)
    v = tl.load(x_ptr + offs, mask=mask)  # no `other`: zeros where masked
    tl.store(out_ptr + offs, v)
    tl.store(out_ptr + BLOCK + offs, v, mask=(offs > LO) & (offs <= HI))
    w = tl.load(x_ptr + offs, mask=mask, other=offs.to(tl.float32) * 0.5)  # a block `other`
    tl.store(out_ptr + 2 * BLOCK + offs, w)


@triton.jit
def strided_kernel(x_ptr, out_ptr, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs * STRIDE, mask=offs * STRIDE < BLOCK * STRIDE - 3, other=7)
    tl.store(out_ptr + offs * STRIDE + 1, v)


@triton.jit
def irregular_kernel(x_ptr, idx_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    rev = BLOCK - 1 - offs  # a decreasing block
    even = offs % 2 == 0  # not an interval
    tl.store(out_ptr + offs, tl.load(x_ptr + rev, mask=even, other=3))
    gathered = tl.load(x_ptr + tl.load(idx_ptr + offs))  # pointers read from memory
    tl.store(out_ptr + BLOCK + rev, gathered, mask=offs < BLOCK - 1)
    tl.store(out_ptr + 2 * BLOCK + offs, 5, mask=offs >= 3)  # a constant value


@triton.jit
def wrap_kernel(out_ptr, BASE, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs * 3 + BASE)  # int32: wraps past 2**31 - 1 like numpy


@triton.jit
def grid_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    rows = tl.arange(0, 4)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    tl.store(out_ptr + rows * BLOCK + cols, tl.load(x_ptr + rows * BLOCK + cols) * 2)


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8]


def _data(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g).to(dtype)
        x[::97] = float("nan")  # NaN payloads must survive the copies too
        return x
    return torch.randint(-100, 100, (n,), generator=g).to(dtype)


def _both(run):
    """``run()`` on the patched, then on the stock interpreter: two lists of bytes."""
    assert _interp_fast.installed(), "the fast path is not installed on this Triton"
    fast = [t.view(torch.uint8).clone() for t in run()]
    _interp_fast.uninstall()
    try:
        stock = [t.view(torch.uint8).clone() for t in run()]
    finally:
        _interp_fast.install()
    return fast, stock


def _assert_same(fast, stock):
    for k, (a, b) in enumerate(zip(fast, stock, strict=True)):
        assert torch.equal(a, b), f"output {k} differs from the stock interpreter"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_contiguous_masked_copy_matches_stock_bytes(dtype):
    x = _data(N + 8, dtype)

    def run():
        out = torch.full((N + 8,), 9, dtype=dtype)
        copy_kernel[(1,)](x, out, N, OTHER=-2, BLOCK=BLOCK)
        return [out]

    fast, stock = _both(run)
    _assert_same(fast, stock)
    got = fast[0].view(dtype)
    assert torch.equal(got[:N].view(torch.uint8), x[:N].view(torch.uint8))
    assert torch.equal(got[N + 5:], torch.full((3,), 9, dtype=dtype))
    if dtype != torch.bfloat16:  # the stock interpreter casts an int `other` to bf16 as
        assert torch.equal(got[N:N + 5], torch.full((5,), -2, dtype=dtype))  # raw bits


@pytest.mark.parametrize("lo,hi", [(0, 256), (10, 200), (200, 10), (-5, 300), (255, 256)])
def test_interval_masks_with_a_lower_bound_match_stock(lo, hi):
    x = _data(2 * BLOCK, torch.float32, seed=1)

    def run():
        out = torch.full((3 * BLOCK,), -1.0)
        window_kernel[(1,)](x, out, lo, hi, BLOCK=BLOCK)
        return [out]

    _assert_same(*_both(run))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("stride", [2, 3])
def test_strided_loads_and_stores_match_stock(dtype, stride):
    x = _data(BLOCK * stride + 4, dtype, seed=2)

    def run():
        out = torch.zeros(BLOCK * stride + 4, dtype=dtype)
        strided_kernel[(1,)](x, out, STRIDE=stride, BLOCK=BLOCK)
        return [out]

    _assert_same(*_both(run))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_reversed_gathered_and_non_interval_accesses_match_stock(dtype):
    x = _data(BLOCK, dtype, seed=3)
    idx = torch.randperm(BLOCK, generator=torch.Generator().manual_seed(4)).to(torch.int32)

    def run():
        out = torch.zeros(3 * BLOCK, dtype=dtype)
        irregular_kernel[(1,)](x, idx, out, BLOCK=BLOCK)
        return [out]

    fast, stock = _both(run)
    _assert_same(fast, stock)
    got = fast[0].view(dtype)
    assert torch.equal(got[1:BLOCK:2], torch.full((BLOCK // 2,), 3, dtype=dtype))
    assert torch.equal(got[2 * BLOCK + 3:], torch.full((BLOCK - 3,), 5, dtype=dtype))


def test_int32_index_arithmetic_wraps_like_the_stock_interpreter():
    def run():
        out = torch.zeros(BLOCK, dtype=torch.int32)
        wrap_kernel[(1,)](out, 2**31 - 400, BLOCK=BLOCK)
        return [out]

    fast, stock = _both(run)
    _assert_same(fast, stock)
    assert fast[0].view(torch.int32).min() < 0  # it did wrap


def test_two_dimensional_blocks_take_the_stock_path_unchanged():
    x = _data(4 * 64, torch.float32, seed=5)

    def run():
        out = torch.empty(4 * 64)
        grid_kernel[(1,)](x, out, BLOCK=64)
        return [out]

    fast, stock = _both(run)
    _assert_same(fast, stock)
    torch.testing.assert_close(fast[0].view(torch.float32), x * 2, equal_nan=True)


def test_contiguous_blocks_are_copied_as_slices(monkeypatch):
    """The fast path really runs: one slice view per contiguous load and store."""
    views = []
    real = _memory._view
    monkeypatch.setattr(_memory, "_view", lambda *a: views.append(a) or real(*a))
    x, out = _data(N, torch.float32), torch.empty(N + 8)
    copy_kernel[(1,)](x, out, N, OTHER=0, BLOCK=BLOCK)
    blocks = -(-(N + BLOCK) // BLOCK)
    assert len(views) == 2 * (blocks - 1)  # the block past the end touches nothing


def test_a_failed_self_check_leaves_the_stock_interpreter(monkeypatch):
    from triton.runtime import interpreter as ti

    patched = ti.InterpreterBuilder.create_addptr
    _interp_fast.uninstall()
    stock = ti.InterpreterBuilder.create_addptr
    assert stock is not patched
    try:
        monkeypatch.setattr(_selfcheck, "self_check", lambda ti: "result 0 differs")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _interp_fast.install() is False
        assert any("self-check failed (result 0 differs)" in str(w.message) for w in caught)
        assert ti.InterpreterBuilder.create_addptr is stock
        assert not _interp_fast.installed() and not _memory._STATE["fast"]
    finally:
        monkeypatch.undo()
        assert _interp_fast.install()
    assert ti.InterpreterBuilder.create_addptr is patched
