"""Symbolic index blocks for Triton's interpreter: ``tl.arange`` arithmetic without arrays.

The builder keeps three kinds of block *symbolic* until something needs their values:

- ``Range``: ``start + step * i`` (``tl.arange`` and affine arithmetic on it, pointers
  included), only while every value fits its dtype, so no wrap-around is ever folded;
- ``Const``: a splatted scalar;
- ``Interval``: a boolean block that is True exactly for ``lo <= i < hi``
  (comparisons of a ``Range`` with a ``Const``, and ``&`` of those).

Every other op sees ``.data``, which materialises the exact array the stock builder
would have made, so unknown ops stay correct. ``PATCHES`` names the builder methods
replaced here (``fastmem`` installs them); ``memory`` turns loads and stores through a
``Range`` into slice copies.
"""

from __future__ import annotations

import numpy as np
from triton.runtime.interpreter import TensorHandle, _get_np_dtype

from commlab._interpreter.stock import STOCK, base

# --- symbolic handles ---------------------------------------------------------------


class Lazy(TensorHandle):
    """A TensorHandle whose ``data`` is computed on first use (then cached)."""

    def __init__(self, dtype, np_dtype, shape):
        self._data = None
        self.dtype = dtype
        self.attr = {}
        self.np_dtype = np.dtype(np_dtype)
        self.shape = tuple(shape)

    @property
    def data(self):
        if self._data is None:
            self._data = self.materialize()
        return self._data

    @data.setter
    def data(self, value):
        self._data = value

    def __bool__(self):
        return bool(self.data.all())


class Range(Lazy):
    """start + step * i for i in 0..n-1 (step >= 0, every value fits np_dtype)."""

    def __init__(self, dtype, np_dtype, n, start, step):
        super().__init__(dtype, np_dtype, (n,))
        self.n, self.start, self.step = n, start, step

    def materialize(self):
        wide = np.uint64 if self.np_dtype.kind == "u" else np.int64
        i = np.arange(self.n, dtype=wide)
        return (i * wide(self.step) + wide(self.start)).astype(self.np_dtype)


class Const(Lazy):
    """A block filled with one value (``value``: a 1-element array of np_dtype)."""

    def __init__(self, dtype, value, shape):
        super().__init__(dtype, value.dtype, shape)
        self.value = value

    def materialize(self):
        return np.full(self.shape, self.value[0], dtype=self.np_dtype)

    def __bool__(self):
        return bool(self.value.all())


class Interval(Lazy):
    """A bool block, True exactly for lo <= i < hi (normalised: 0 <= lo <= hi <= n)."""

    def __init__(self, dtype, n, lo, hi):
        super().__init__(dtype, np.bool_, (n,))
        lo, hi = max(0, min(lo, n)), max(0, min(hi, n))
        self.n, self.lo, self.hi = n, lo, max(lo, hi)

    def materialize(self):
        m = np.zeros(self.n, dtype=np.bool_)
        m[self.lo:self.hi] = True
        return m

    def __bool__(self):
        return self.lo == 0 and self.hi == self.n


# --- folding rules ------------------------------------------------------------------


def _fits(np_dtype, *values) -> bool:
    if np_dtype.kind not in "iu":
        return False
    info = np.iinfo(np_dtype)
    return all(info.min <= v <= info.max for v in values)


def _range(dtype, np_dtype, n, start, step):
    """A Range, or None when a value would not fit (numpy would wrap: not folded)."""
    if step < 0 or not _fits(np_dtype, start, start + step * (n - 1)):
        return None
    return Range(dtype, np_dtype, n, start, step)


def _scalar(h):
    """The single value of a Const as a Python int, or None."""
    if type(h) is Const and h.np_dtype.kind in "iu":
        return int(h.value[0])
    return None


def interval_of(h):
    """(lo, hi) of a boolean block known to be an interval, or None."""
    if type(h) is Interval:
        return h.lo, h.hi
    if type(h) is Const and h.np_dtype == np.bool_ and len(h.shape) == 1:
        return (0, h.shape[0]) if bool(h.value[0]) else (0, 0)
    return None


def _count_below(r, v, inclusive):
    """How many leading lanes of Range r are < v (<= v if inclusive); step > 0."""
    d = v - r.start
    if inclusive:
        return d // r.step + 1 if d >= 0 else 0
    return -(-d // r.step) if d > 0 else 0


def _compare(r, v, op, reverse):
    """Range r (op) scalar v, or v (op) r when reverse, as (lo, hi) of the True lanes."""
    if reverse:  # v < r  <=>  r > v, and so on
        op = {np.less: np.greater, np.less_equal: np.greater_equal,
              np.greater: np.less, np.greater_equal: np.less_equal}[op]
    if r.step == 0:
        return (0, r.n) if op(r.start, v) else (0, 0)
    if op is np.less:
        return 0, _count_below(r, v, False)
    if op is np.less_equal:
        return 0, _count_below(r, v, True)
    if op is np.greater:
        return _count_below(r, v, True), r.n
    return _count_below(r, v, False), r.n  # greater_equal


_CMP = (np.less, np.less_equal, np.greater, np.greater_equal)


def _fold_binary(builder, lhs, rhs, op):
    """The folded result of ``builder.binary_op(lhs, rhs, op)``, or None (stock path)."""
    lazy_l, lazy_r = isinstance(lhs, Lazy), isinstance(rhs, Lazy)
    if not (lazy_l and lazy_r):  # a real array with a constant: the constant stays one
        c, other = (rhs, lhs) if type(rhs) is Const else (lhs, rhs)  # element (numpy
        if type(c) is Const and not isinstance(other, Lazy) and (  # broadcasts it)
                other.data.shape == c.shape):
            pair = (other, _small(c)) if c is rhs else (_small(c), other)
            return STOCK["binary_op"](builder, *pair, op)
        return None
    if lhs.shape != rhs.shape:
        return None
    tl_dtype = lhs.dtype.scalar
    if type(lhs) is Const and type(rhs) is Const:  # elementwise: fold one element
        one = STOCK["binary_op"](builder, _small(lhs), _small(rhs), op)
        return Const(one.dtype, one.data.reshape(1), lhs.shape)
    if lhs.np_dtype != rhs.np_dtype or not _same_width(lhs.np_dtype, tl_dtype):
        return None
    r, c, reverse = (lhs, rhs, False) if type(lhs) is Range else (rhs, lhs, True)
    if type(r) is Range and type(c) is Const:
        v = _scalar(c)
        if v is None:
            return None
        if op is np.add:
            return _range(tl_dtype, r.np_dtype, r.n, r.start + v, r.step)
        if op is np.subtract and not reverse:
            return _range(tl_dtype, r.np_dtype, r.n, r.start - v, r.step)
        if op is np.multiply:
            return _range(tl_dtype, r.np_dtype, r.n, r.start * v, r.step * v)
        if op in _CMP:
            lo, hi = _compare(r, v, op, reverse)
            return Interval(tl_dtype, r.n, lo, hi)
        return None
    if op is np.bitwise_and and lhs.np_dtype == np.bool_:
        a, b = interval_of(lhs), interval_of(rhs)
        if a is not None and b is not None:
            return Interval(tl_dtype, lhs.shape[0], max(a[0], b[0]), min(a[1], b[1]))
    return None


def _same_width(np_dtype, tl_dtype) -> bool:
    """The stock binary_op keeps numpy's result dtype unless it is wider than tl_dtype."""
    width = max(8, tl_dtype.primitive_bitwidth) if not tl_dtype.is_ptr() else 64
    return np_dtype.itemsize * 8 <= width


def _small(h):
    """A 1-element stock TensorHandle holding a Const's value."""
    return base()(h.value.copy(), h.dtype)


# --- builder methods ----------------------------------------------------------------


def _binary_op(self, lhs, rhs, op):
    if isinstance(lhs, Lazy) or isinstance(rhs, Lazy):
        out = _fold_binary(self, lhs, rhs, op)
        if out is not None:
            return out
    return STOCK["binary_op"](self, lhs, rhs, op)


def _create_make_range(self, ret_ty, start, stop):
    return Range(_tl().int32, np.int32, stop - start, start, 1)


def _create_splat(self, ret_ty, arg):
    data = arg.value if type(arg) is Const else arg.data
    if data.size != 1:
        return STOCK["create_splat"](self, ret_ty, arg)
    value = data.reshape(1).astype(_get_np_dtype(arg.dtype))  # np.full's unsafe cast
    return Const(arg.dtype.scalar, value, ret_ty.shape)


def _create_broadcast(self, arg, shape):
    if type(arg) is Const:
        return Const(arg.dtype.scalar, arg.value, shape)
    return STOCK["create_broadcast"](self, arg, shape)


def _cast_impl(self, src, dst_type):
    if type(src) is Const:
        one = STOCK["cast_impl"](self, _small(src), dst_type)
        return Const(one.dtype, one.data.reshape(1), src.shape)
    if type(src) is Range:
        np_dtype = _get_np_dtype(dst_type)
        if np_dtype.kind in "iu":
            out = _range(dst_type.scalar, np_dtype, src.n, src.start, src.step)
            if out is not None:
                return out
    return STOCK["cast_impl"](self, src, dst_type)


def _create_bitcast(self, src, dst_type):
    if type(src) in (Range, Const):
        if _get_np_dtype(dst_type) == src.np_dtype:  # same bits, another Triton type
            if type(src) is Range:
                return Range(dst_type.scalar, src.np_dtype, src.n, src.start, src.step)
            return Const(dst_type.scalar, src.value, src.shape)
    return STOCK["create_bitcast"](self, src, dst_type)


def _create_addptr(self, ptr, offset):
    if isinstance(ptr, Lazy) and isinstance(offset, Lazy) and ptr.shape == offset.shape:
        width = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
        p = (ptr.start, ptr.step) if type(ptr) is Range else (_ptr_value(ptr), 0)
        o = (offset.start, offset.step) if type(offset) is Range else (_scalar(offset), 0)
        if None not in p and None not in o and ptr.np_dtype == np.uint64 and (
                type(ptr) is Range or type(offset) is Range):
            out = _range(ptr.dtype, ptr.np_dtype, ptr.shape[0], p[0] + width * o[0],
                         p[1] + width * o[1])
            if out is not None:
                return out
    return STOCK["create_addptr"](self, ptr, offset)


def _ptr_value(h):
    return int(h.value[0]) if type(h) is Const and h.np_dtype == np.uint64 else None




def _patch_lang_tensor(tensor, scope):
    """Triton's per-launch tensor patches, then a ``__bool__`` that does not compute a
    symbolic block's values (``other if other else None`` in ``tl.load`` asks it)."""
    STOCK["_patch_lang_tensor"](tensor, scope)
    stock_bool = tensor.__bool__

    def as_bool(self):
        h = self.handle
        if isinstance(h, Lazy):  # Triton: only 1-element blocks have a truth value
            return bool(h) if int(np.prod(h.shape)) == 1 else True
        return stock_bool(self)

    scope.set_attr(tensor, "__bool__", as_bool)


def _tl():
    import triton.language as tl

    return tl


# builder method -> (replacement, the stock signature it was written against)
PATCHES = {
    "binary_op": (_binary_op, ["self", "lhs", "rhs", "op"]),
    "create_make_range": (_create_make_range, ["self", "ret_ty", "start", "stop"]),
    "create_splat": (_create_splat, ["self", "ret_ty", "arg"]),
    "create_broadcast": (_create_broadcast, ["self", "arg", "shape"]),
    "cast_impl": (_cast_impl, ["self", "src", "dst_type"]),
    "create_bitcast": (_create_bitcast, ["self", "src", "dst_type"]),
    "create_addptr": (_create_addptr, ["self", "ptr", "offset"]),
}
MODULE_PATCHES = {"_patch_lang_tensor": (_patch_lang_tensor, ["tensor", "scope"])}
