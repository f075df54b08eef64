"""Check the patched builder against the stock one on a script of the kernels' idioms.

``fastmem.install`` runs ``self_check`` right after patching: index arithmetic, masked
and strided loads and stores go through both builders, and any difference in a result,
in the stored memory, or blocks that did not stay symbolic turns the fast path off.
"""

from __future__ import annotations

import numpy as np

from commlab._interpreter.blocks import Interval, Lazy, Range
from commlab._interpreter.stock import STOCK
from commlab._interpreter.stock import base as _handle


class _Stock:
    """The builder with the stock methods, every argument materialised first."""

    def __init__(self, builder):
        self._b = builder

    def __getattr__(self, name):
        fn = STOCK.get(name) or getattr(type(self._b), name)

        def call(*args):
            args = [_handle()(a.data, a.dtype) if isinstance(a, Lazy) else a for a in args]
            return fn(self._b, *args)
        return call


def _script(b, tl, buf: np.ndarray, n: int):
    """Index arithmetic, masked/strided loads and stores as the kernels use them."""
    i32, i64 = tl.int32, tl.int64
    pf32 = tl.pointer_type(tl.float32)
    blk = tl.block_type(i32, [n])
    th = _handle()
    rng = b.create_make_range(blk, 0, n)
    start = b.create_splat(blk, th(np.array([3], np.int32), i32))
    offs = b.binary_op(rng, start, np.add)  # 3 .. n+2
    wide = b.cast_impl(offs, tl.block_type(i64, [n]))
    lim = b.create_splat(tl.block_type(i64, [n]), th(np.array([n - 5], np.int64), i64))
    mask = b.binary_op(b.binary_op(wide, lim, np.less), b.binary_op(lim, wide, np.greater_equal),
                       np.bitwise_and)
    base = b.create_splat(tl.block_type(pf32, [n]),
                          th(np.array([buf.ctypes.data], np.uint64), pf32))
    ptrs = b.create_addptr(base, wide)
    other = b.create_splat(tl.block_type(tl.float32, [n]), th(np.array([-1.5], np.float32),
                                                               tl.float32))
    got = [b.create_masked_load(ptrs, mask, other, None, False),
           b.create_masked_load(ptrs, mask, None, None, False)]
    two = b.create_splat(tl.block_type(i64, [n]), th(np.array([2], np.int64), i64))
    strided = b.create_addptr(base, b.binary_op(wide, two, np.multiply))
    got.append(b.create_load(strided, None, False))
    val = b.binary_op(got[0], other, np.add)
    b.create_masked_store(b.create_addptr(base, b.cast_impl(rng, tl.block_type(i64, [n]))),
                          val, mask, None)
    b.create_store(strided, got[2], None)
    kinds = (type(offs), type(mask), type(ptrs), type(strided))
    return [g.data for g in got] + [mask.data, offs.data], kinds


def self_check(ti) -> str:
    """Run _script through the patched and the stock builder; "" if identical."""
    import triton.language as tl

    n = 64
    init = np.random.default_rng(0).standard_normal(4 * n).astype(np.float32)
    bufs = [init.copy(), init.copy()]
    builder = ti.InterpreterBuilder()
    fast, kinds = _script(builder, tl, bufs[0], n)
    stock, _ = _script(_Stock(builder), tl, bufs[1], n)
    if kinds != (Range, Interval, Range, Range):
        return f"blocks were not kept symbolic: {kinds}"
    for k, (a, b) in enumerate(zip(fast, stock, strict=True)):
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            return f"result {k} differs"
    if bufs[0].tobytes() != bufs[1].tobytes():
        return "stored memory differs"
    return ""
