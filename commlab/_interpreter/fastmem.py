"""Interpreter speed-up: index blocks stay symbolic, contiguous loads and stores are slices.

Triton's interpreter runs every block op as a numpy call on whole arrays. The index
arithmetic of a typical kernel line

    offs = start + tl.arange(0, BLOCK);  mask = offs < N
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

costs about ten of them (the int32 add is checked for overflow in int64: a cast, an
add, two compares, an and), and then ``load``/``store`` gather and scatter element by
element through a [BLOCK] array of uint64 addresses. For a CPU all-reduce of 1M floats
that was most of the time.

Here the builder keeps three kinds of block *symbolic* until something needs their
values:

- ``_Range``: ``start + step * i`` (``tl.arange`` and affine arithmetic on it, pointers
  included), only while every value fits its dtype, so no wrap-around is ever folded;
- ``_Const``: a splatted scalar;
- ``_Interval``: a boolean block that is True exactly for ``lo <= i < hi``
  (comparisons of a ``_Range`` with a ``_Const``, and ``&`` of those).

A masked load or store through a ``_Range`` of pointers with a step of at least the
element size and an ``_Interval`` (or constant) mask becomes a byte copy between
numpy views of the same memory: what Triton's C++ ``load``/``store`` do element by
element (``memcpy`` of each element, ``other`` where masked), done at once. Every
other op sees ``.data``, which materialises the exact array the stock builder would
have made, so unknown ops stay correct. ``install()`` patches only the Triton
interpreter it was written against (3.x, method signatures checked), runs a
self-check against the stock builder and leaves the stock path in place, with a
warning, if anything differs. ``COMMLAB_INTERPRETER_FASTMEM=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import os
import warnings

import numpy as np

_ORIGINAL: dict = {}  # builder method name -> stock function, once installed


# --- symbolic handles ---------------------------------------------------------------


def _base():
    from triton.runtime.interpreter import TensorHandle

    return TensorHandle


def _make_classes():
    TensorHandle = _base()

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

    return Lazy, Range, Const, Interval


_Lazy = _Range = _Const = _Interval = None


# --- folding rules ------------------------------------------------------------------


def _fits(np_dtype, *values) -> bool:
    if np_dtype.kind not in "iu":
        return False
    info = np.iinfo(np_dtype)
    return all(info.min <= v <= info.max for v in values)


def _range(dtype, np_dtype, n, start, step):
    """A _Range, or None when a value would not fit (numpy would wrap: not folded)."""
    if step < 0 or not _fits(np_dtype, start, start + step * (n - 1)):
        return None
    return _Range(dtype, np_dtype, n, start, step)


def _scalar(h):
    """The single value of a _Const as a Python int, or None."""
    if type(h) is _Const and h.np_dtype.kind in "iu":
        return int(h.value[0])
    return None


def _interval_of(h):
    """(lo, hi) of a boolean block known to be an interval, or None."""
    if type(h) is _Interval:
        return h.lo, h.hi
    if type(h) is _Const and h.np_dtype == np.bool_ and len(h.shape) == 1:
        return (0, h.shape[0]) if bool(h.value[0]) else (0, 0)
    return None


def _count_below(r, v, inclusive):
    """How many leading lanes of _Range r are < v (<= v if inclusive); step > 0."""
    d = v - r.start
    if inclusive:
        return d // r.step + 1 if d >= 0 else 0
    return -(-d // r.step) if d > 0 else 0


def _compare(r, v, op, reverse):
    """_Range r (op) scalar v, or v (op) r when reverse, as (lo, hi) of the True lanes."""
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
    lazy_l, lazy_r = isinstance(lhs, _Lazy), isinstance(rhs, _Lazy)
    if not (lazy_l and lazy_r):  # a real array with a constant: the constant stays one
        c, other = (rhs, lhs) if type(rhs) is _Const else (lhs, rhs)  # element (numpy
        if type(c) is _Const and not isinstance(other, _Lazy) and (  # broadcasts it)
                other.data.shape == c.shape):
            pair = (other, _small(c)) if c is rhs else (_small(c), other)
            return _ORIGINAL["binary_op"](builder, *pair, op)
        return None
    if lhs.shape != rhs.shape:
        return None
    tl_dtype = lhs.dtype.scalar
    if type(lhs) is _Const and type(rhs) is _Const:  # elementwise: fold one element
        one = _ORIGINAL["binary_op"](builder, _small(lhs), _small(rhs), op)
        return _Const(one.dtype, one.data.reshape(1), lhs.shape)
    if lhs.np_dtype != rhs.np_dtype or not _same_width(lhs.np_dtype, tl_dtype):
        return None
    r, c, reverse = (lhs, rhs, False) if type(lhs) is _Range else (rhs, lhs, True)
    if type(r) is _Range and type(c) is _Const:
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
            return _Interval(tl_dtype, r.n, lo, hi)
        return None
    if op is np.bitwise_and and lhs.np_dtype == np.bool_:
        a, b = _interval_of(lhs), _interval_of(rhs)
        if a is not None and b is not None:
            return _Interval(tl_dtype, lhs.shape[0], max(a[0], b[0]), min(a[1], b[1]))
    return None


def _same_width(np_dtype, tl_dtype) -> bool:
    """The stock binary_op keeps numpy's result dtype unless it is wider than tl_dtype."""
    width = max(8, tl_dtype.primitive_bitwidth) if not tl_dtype.is_ptr() else 64
    return np_dtype.itemsize * 8 <= width


def _small(h):
    """A 1-element stock TensorHandle holding a _Const's value."""
    return _base()(h.value.copy(), h.dtype)


# --- builder methods ----------------------------------------------------------------


def _binary_op(self, lhs, rhs, op):
    if isinstance(lhs, _Lazy) or isinstance(rhs, _Lazy):
        out = _fold_binary(self, lhs, rhs, op)
        if out is not None:
            return out
    return _ORIGINAL["binary_op"](self, lhs, rhs, op)


def _create_make_range(self, ret_ty, start, stop):
    return _Range(_tl().int32, np.int32, stop - start, start, 1)


def _create_splat(self, ret_ty, arg):
    data = arg.value if type(arg) is _Const else arg.data
    if data.size != 1:
        return _ORIGINAL["create_splat"](self, ret_ty, arg)
    from triton.runtime.interpreter import _get_np_dtype

    value = data.reshape(1).astype(_get_np_dtype(arg.dtype))  # np.full's unsafe cast
    return _Const(arg.dtype.scalar, value, ret_ty.shape)


def _create_broadcast(self, arg, shape):
    if type(arg) is _Const:
        return _Const(arg.dtype.scalar, arg.value, shape)
    return _ORIGINAL["create_broadcast"](self, arg, shape)


def _cast_impl(self, src, dst_type):
    if type(src) is _Const:
        one = _ORIGINAL["cast_impl"](self, _small(src), dst_type)
        return _Const(one.dtype, one.data.reshape(1), src.shape)
    if type(src) is _Range:
        from triton.runtime.interpreter import _get_np_dtype

        np_dtype = _get_np_dtype(dst_type)
        if np_dtype.kind in "iu":
            out = _range(dst_type.scalar, np_dtype, src.n, src.start, src.step)
            if out is not None:
                return out
    return _ORIGINAL["cast_impl"](self, src, dst_type)


def _create_bitcast(self, src, dst_type):
    if type(src) in (_Range, _Const):
        from triton.runtime.interpreter import _get_np_dtype

        if _get_np_dtype(dst_type) == src.np_dtype:  # same bits, another Triton type
            if type(src) is _Range:
                return _Range(dst_type.scalar, src.np_dtype, src.n, src.start, src.step)
            return _Const(dst_type.scalar, src.value, src.shape)
    return _ORIGINAL["create_bitcast"](self, src, dst_type)


def _create_addptr(self, ptr, offset):
    if isinstance(ptr, _Lazy) and isinstance(offset, _Lazy) and ptr.shape == offset.shape:
        width = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
        p = (ptr.start, ptr.step) if type(ptr) is _Range else (_ptr_value(ptr), 0)
        o = (offset.start, offset.step) if type(offset) is _Range else (_scalar(offset), 0)
        if None not in p and None not in o and ptr.np_dtype == np.uint64 and (
                type(ptr) is _Range or type(offset) is _Range):
            out = _range(ptr.dtype, ptr.np_dtype, ptr.shape[0], p[0] + width * o[0],
                         p[1] + width * o[1])
            if out is not None:
                return out
    return _ORIGINAL["create_addptr"](self, ptr, offset)


def _ptr_value(h):
    return int(h.value[0]) if type(h) is _Const and h.np_dtype == np.uint64 else None


def _mask_interval(mask, n):
    if mask is None:
        return 0, n
    return _interval_of(mask)


def _view(addr: int, r, lo: int, hi: int, itemsize: int):
    """Lanes lo..hi-1 of the pointer block r as a [k, itemsize] uint8 view of memory."""
    k = hi - lo
    first = addr + r.step * lo
    span = r.step * (k - 1) + itemsize
    raw = np.frombuffer((ctypes.c_char * span).from_address(first), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(raw, shape=(k, itemsize), strides=(r.step, 1))


def _fast_load(ptrs, mask, other):
    """The stock masked load as slice copies, or None when it does not apply."""
    if type(ptrs) is not _Range:
        return None
    from triton.runtime.interpreter import _get_np_dtype

    dtype_tt = ptrs.get_element_ty()
    np_dtype = _get_np_dtype(dtype_tt)
    isz, n = np_dtype.itemsize, ptrs.n
    span = _mask_interval(mask, n)
    if span is None or ptrs.step < isz:
        return None
    if other is not None and (other.np_dtype if type(other) is _Const
                              else other.data.dtype) != np_dtype:
        return None
    lo, hi = span
    out = np.empty(n, dtype=np_dtype)
    raw = out.view(np.uint8).reshape(n, isz)
    if lo > 0 or hi < n:  # masked-off lanes take `other` (zeros without one)
        if other is None:
            raw[:lo] = 0
            raw[hi:] = 0
        elif type(other) is _Const:
            fill = other.value.view(np.uint8).reshape(1, isz)
            raw[:lo] = fill
            raw[hi:] = fill
        else:
            src = np.ascontiguousarray(other.data.reshape(-1)).view(np.uint8).reshape(n, isz)
            raw[:lo] = src[:lo]
            raw[hi:] = src[hi:]
    if hi > lo:
        raw[lo:hi] = _view(ptrs.start, ptrs, lo, hi, isz)
    return _base()(out, dtype_tt)


def _fast_store(ptrs, value, mask) -> bool:
    """The stock masked store as one slice copy; False when it does not apply."""
    if type(ptrs) is not _Range:
        return False
    span = _mask_interval(mask, ptrs.n)
    n = ptrs.n
    if span is None:
        return False
    if type(value) is _Const:
        isz = value.np_dtype.itemsize
        src = value.value.view(np.uint8).reshape(1, isz)
    else:
        data = value.data
        if data.size != n:
            return False
        isz = data.itemsize
        src = np.ascontiguousarray(data.reshape(-1)).view(np.uint8).reshape(n, isz)
    if ptrs.step < isz:  # overlapping lanes: keep the stock element order
        return False
    lo, hi = span
    if hi > lo:
        _view(ptrs.start, ptrs, lo, hi, isz)[...] = src if src.shape[0] == 1 else src[lo:hi]
    return True


def _create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
    out = _fast_load(ptrs, mask, other)
    if out is not None:
        return out
    return _ORIGINAL["create_masked_load"](self, ptrs, mask, other, cache_policy, is_volatile)


def _create_load(self, ptr, cache_policy, is_volatile):
    out = _fast_load(ptr, None, None)
    if out is not None:
        return out
    return _ORIGINAL["create_load"](self, ptr, cache_policy, is_volatile)


def _create_masked_store(self, ptrs, value, mask, cache_policy):
    if not _fast_store(ptrs, value, mask):
        return _ORIGINAL["create_masked_store"](self, ptrs, value, mask, cache_policy)


def _create_store(self, ptr, val, cache_policy):
    if not _fast_store(ptr, val, None):
        return _ORIGINAL["create_store"](self, ptr, val, cache_policy)


_PATCHES = {
    "binary_op": (_binary_op, ["self", "lhs", "rhs", "op"]),
    "create_make_range": (_create_make_range, ["self", "ret_ty", "start", "stop"]),
    "create_splat": (_create_splat, ["self", "ret_ty", "arg"]),
    "create_broadcast": (_create_broadcast, ["self", "arg", "shape"]),
    "cast_impl": (_cast_impl, ["self", "src", "dst_type"]),
    "create_bitcast": (_create_bitcast, ["self", "src", "dst_type"]),
    "create_addptr": (_create_addptr, ["self", "ptr", "offset"]),
    "create_masked_load": (_create_masked_load,
                           ["self", "ptrs", "mask", "other", "cache_policy", "is_volatile"]),
    "create_load": (_create_load, ["self", "ptr", "cache_policy", "is_volatile"]),
    "create_masked_store": (_create_masked_store,
                            ["self", "ptrs", "value", "mask", "cache_policy"]),
    "create_store": (_create_store, ["self", "ptr", "val", "cache_policy"]),
}


def _patch_lang_tensor(tensor, scope):
    """Triton's per-launch tensor patches, then a ``__bool__`` that does not compute a
    symbolic block's values (``other if other else None`` in ``tl.load`` asks it)."""
    _ORIGINAL["_patch_lang_tensor"](tensor, scope)
    stock_bool = tensor.__bool__

    def as_bool(self):
        h = self.handle
        if isinstance(h, _Lazy):  # Triton: only 1-element blocks have a truth value
            return bool(h) if int(np.prod(h.shape)) == 1 else True
        return stock_bool(self)

    scope.set_attr(tensor, "__bool__", as_bool)


def _tl():
    import triton.language as tl

    return tl


# --- self-check ---------------------------------------------------------------------


class _Stock:
    """The builder with the stock methods, every argument materialised first."""

    def __init__(self, builder):
        self._b = builder

    def __getattr__(self, name):
        fn = _ORIGINAL.get(name) or getattr(type(self._b), name)

        def call(*args):
            args = [_base()(a.data, a.dtype) if isinstance(a, _Lazy) else a for a in args]
            return fn(self._b, *args)
        return call


def _script(b, tl, buf: np.ndarray, n: int):
    """Index arithmetic, masked/strided loads and stores as the kernels use them."""
    i32, i64 = tl.int32, tl.int64
    pf32 = tl.pointer_type(tl.float32)
    blk = tl.block_type(i32, [n])
    th = _base()
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


def _self_check(ti) -> str:
    """Run _script through the patched and the stock builder; "" if identical."""
    tl = _tl()
    n = 64
    init = np.random.default_rng(0).standard_normal(4 * n).astype(np.float32)
    bufs = [init.copy(), init.copy()]
    builder = ti.InterpreterBuilder()
    fast, kinds = _script(builder, tl, bufs[0], n)
    stock, _ = _script(_Stock(builder), tl, bufs[1], n)
    if kinds != (_Range, _Interval, _Range, _Range):
        return f"blocks were not kept symbolic: {kinds}"
    for k, (a, b) in enumerate(zip(fast, stock, strict=True)):
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            return f"result {k} differs"
    if bufs[0].tobytes() != bufs[1].tobytes():
        return "stored memory differs"
    return ""


# --- install ------------------------------------------------------------------------


_MODULE_PATCHES = {"_patch_lang_tensor": (_patch_lang_tensor, ["tensor", "scope"])}


def _skip_dead_overflow_checks(ti) -> bool:
    """Integer ``+ - *`` on the interpreter compute an int64 overflow condition (a cast,
    the op, two compares, an and: ~8 interpreted ops per scalar add) and hand it to
    ``device_assert``, which returns at once unless the options ask for debug. Skip
    the computation in exactly that case; with debug on, the stock check runs."""
    sem = getattr(ti, "interpreter_semantic", None)
    cls = type(sem)
    try:
        check = inspect.getsource(cls.binary_op_sanitize_overflow_impl)
        dev = inspect.getsource(cls.device_assert)
    except (AttributeError, OSError, TypeError):
        return False
    if ("self.device_assert(cond" not in check or
            "if not self.builder.options.debug:\n            return" not in dev):
        return False  # another shape: keep the stock check
    stock = sem.binary_op_sanitize_overflow_impl

    def sanitize(lhs, rhs, binary_op):
        if sem.builder.options.debug:
            return stock(lhs, rhs, binary_op)

    _ORIGINAL["sanitize"] = stock
    sem.binary_op_sanitize_overflow_impl = sanitize
    return True


def _compatible(ti) -> str:
    """"" if this Triton interpreter has the shape the patches were written for, else why."""
    import triton

    if not triton.__version__.startswith("3."):
        return f"triton {triton.__version__} (written for 3.x)"
    th = getattr(ti, "TensorHandle", None)
    if th is None or not dataclasses.is_dataclass(th) or [
            f.name for f in dataclasses.fields(th)] != ["data", "dtype", "attr"]:
        return "TensorHandle is not the (data, dtype, attr) dataclass"
    builder = getattr(ti, "InterpreterBuilder", None)
    targets = [(builder, n, p) for n, (_, p) in _PATCHES.items()]
    targets += [(ti, n, p) for n, (_, p) in _MODULE_PATCHES.items()]
    for obj, name, params in targets:
        fn = getattr(obj, name, None)
        if fn is None or list(inspect.signature(fn).parameters) != params:
            return f"{name} has another signature"
    if not hasattr(ti, "_get_np_dtype"):
        return "no _get_np_dtype"
    return ""


def _keep_freed_memory() -> None:
    """Let freed block arrays be reused instead of page-faulted in again.

    Every interpreted op allocates its result (4 MiB for a 1M-element fp32 block).
    glibc serves that from mmap and returns it on free, so the next block faults in
    ~1000 fresh pages (half a 1M-element copy kernel's time). These are the values
    glibc's own dynamic threshold settles at once a 32 MiB block was freed: blocks
    under 32 MiB come from the heap, and up to 64 MiB of free heap stays mapped.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return  # not glibc: its allocator has other knobs
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def install() -> bool:
    """Patch Triton's interpreter builder; return whether the fast path is on."""
    global _Lazy, _Range, _Const, _Interval
    if _ORIGINAL:
        return True
    if os.environ.get("COMMLAB_INTERPRETER_FASTMEM", "1") == "0":
        return False
    from triton.runtime import interpreter as ti

    why = _compatible(ti)
    if why:
        warnings.warn(f"commlab: interpreter fast path off: {why}; the CPU backend runs "
                      "on the stock interpreter (slower, same results)", RuntimeWarning,
                      stacklevel=2)
        return False
    _Lazy, _Range, _Const, _Interval = _make_classes()
    for name, (fn, _) in _PATCHES.items():
        _ORIGINAL[name] = ti.InterpreterBuilder.__dict__[name]
        setattr(ti.InterpreterBuilder, name, fn)
    for name, (fn, _) in _MODULE_PATCHES.items():
        _ORIGINAL[name] = getattr(ti, name)
        setattr(ti, name, fn)
    _skip_dead_overflow_checks(ti)
    try:
        problem = _self_check(ti)
    except Exception as e:  # a crash in the check is a mismatch too
        problem = repr(e)
    if problem:
        uninstall()
        warnings.warn(f"commlab: interpreter fast path off: self-check failed ({problem}); "
                      "the CPU backend runs on the stock interpreter", RuntimeWarning,
                      stacklevel=2)
        return False
    _keep_freed_memory()
    return True


def uninstall() -> None:
    """Put the stock interpreter back (tests compare against it)."""
    if not _ORIGINAL:
        return
    from triton.runtime import interpreter as ti

    sanitize = _ORIGINAL.pop("sanitize", None)
    if sanitize is not None:  # the instance attribute shadowed the class's method
        del ti.interpreter_semantic.binary_op_sanitize_overflow_impl
    for name, fn in _ORIGINAL.items():
        setattr(ti if name in _MODULE_PATCHES else ti.InterpreterBuilder, name, fn)
    _ORIGINAL.clear()


def installed() -> bool:
    return bool(_ORIGINAL)
