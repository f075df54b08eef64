"""Every memory access of an interpreted kernel, one function per access kind.

In Triton 3.x every load, store and atomic of the interpreter goes through six builder
methods (``create_load``, ``create_masked_load``, ``create_store``,
``create_masked_store``, ``create_atomic_rmw``, ``create_atomic_cas``). They are
replaced here whenever the interpreter is on, for two things:

- the slice path (on with ``fastmem``): a load or store through a ``blocks.Range`` of
  pointers with a step of at least the element size and an interval (or constant)
  mask becomes a byte copy between numpy views of the same memory, what Triton's C++
  ``load``/``store`` do element by element (``other`` where masked), done at once;
- the observer hook: ``set_observer(fn)`` routes every access through
  ``fn(access, do)``, where ``do()`` performs it and returns its result; ``fn`` must
  call ``do`` exactly once. With no observer an access costs one ``None`` check.
"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
from typing import Any

import numpy as np
from triton.runtime.interpreter import _get_np_dtype

from commlab._interpreter.blocks import Const, Range, interval_of
from commlab._interpreter.stock import STOCK, base, capture

_STATE: dict[str, Any] = {"fast": False, "observer": None, "installed": False}


@dataclasses.dataclass
class Access:
    """One memory access as the observer sees it (handles are Triton's, maybe symbolic)."""

    kind: str  # "load" | "store" | "atomic_rmw" | "atomic_cas"
    ptrs: Any  # the pointer block: an interpreter TensorHandle (untyped) or a Range
    mask: object = None  # bool block or None (all lanes)
    sem: object = None  # atomics: the interpreter's memory-semantic enum
    op: object = None  # atomic_rmw: the rmw op
    value: object = None  # store/atomic operand
    cmp: object = None  # atomic_cas: the value compared with

    def itemsize(self) -> int:
        return max(1, self.ptrs.get_element_ty().primitive_bitwidth // 8)

    def lanes(self):
        """(addresses, itemsize) of the lanes that touch memory: a uint64 array."""
        isz = self.itemsize()
        if type(self.ptrs) is Range:
            span = mask_interval(self.mask, self.ptrs.n)
            if span is not None:
                lo, hi = span
                return np.arange(lo, hi, dtype=np.uint64) * np.uint64(
                    self.ptrs.step) + np.uint64(self.ptrs.start), isz
        addrs = np.asarray(self.ptrs.data, dtype=np.uint64).reshape(-1)
        if self.mask is not None:
            m = np.broadcast_to(np.asarray(self.mask.data, dtype=bool), self.ptrs.data.shape)
            addrs = addrs[m.reshape(-1)]
        return addrs, isz


def set_observer(fn) -> None:
    """Route every access through ``fn(access, do)``; ``None`` removes it."""
    _STATE["observer"] = fn


def observer():
    return _STATE["observer"]


def set_fast(on: bool) -> None:
    """Turn the slice path on or off (``fastmem`` does, with its symbolic blocks)."""
    _STATE["fast"] = bool(on)


# --- the slice path -----------------------------------------------------------------


def mask_interval(mask, n):
    if mask is None:
        return 0, n
    return interval_of(mask)


def _view(addr: int, r, lo: int, hi: int, itemsize: int):
    """Lanes lo..hi-1 of the pointer block r as a [k, itemsize] uint8 view of memory."""
    k = hi - lo
    first = addr + r.step * lo
    span = r.step * (k - 1) + itemsize
    raw = np.frombuffer((ctypes.c_char * span).from_address(first), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(raw, shape=(k, itemsize), strides=(r.step, 1))


def _fast_load(ptrs, mask, other):
    """The stock masked load as slice copies, or None when it does not apply."""
    if type(ptrs) is not Range:
        return None
    dtype_tt = ptrs.get_element_ty()
    np_dtype = _get_np_dtype(dtype_tt)
    isz, n = np_dtype.itemsize, ptrs.n
    span = mask_interval(mask, n)
    if span is None or ptrs.step < isz:
        return None
    if other is not None and (other.np_dtype if type(other) is Const
                              else other.data.dtype) != np_dtype:
        return None
    lo, hi = span
    out = np.empty(n, dtype=np_dtype)
    raw = out.view(np.uint8).reshape(n, isz)
    if lo > 0 or hi < n:  # masked-off lanes take `other` (zeros without one)
        if other is None:
            raw[:lo] = 0
            raw[hi:] = 0
        elif type(other) is Const:
            fill = other.value.view(np.uint8).reshape(1, isz)
            raw[:lo] = fill
            raw[hi:] = fill
        else:
            src = np.ascontiguousarray(other.data.reshape(-1)).view(np.uint8).reshape(n, isz)
            raw[:lo] = src[:lo]
            raw[hi:] = src[hi:]
    if hi > lo:
        raw[lo:hi] = _view(ptrs.start, ptrs, lo, hi, isz)
    return base()(out, dtype_tt)


def _fast_store(ptrs, value, mask) -> bool:
    """The stock masked store as one slice copy; False when it does not apply."""
    if type(ptrs) is not Range:
        return False
    span = mask_interval(mask, ptrs.n)
    n = ptrs.n
    if span is None:
        return False
    if type(value) is Const:
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


# --- the six access methods ---------------------------------------------------------


def _masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
    out = _fast_load(ptrs, mask, other) if _STATE["fast"] else None
    if out is not None:
        return out
    return STOCK["create_masked_load"](self, ptrs, mask, other, cache_policy, is_volatile)


def _load(self, ptr, cache_policy, is_volatile):
    out = _fast_load(ptr, None, None) if _STATE["fast"] else None
    if out is not None:
        return out
    return STOCK["create_load"](self, ptr, cache_policy, is_volatile)


def _masked_store(self, ptrs, value, mask, cache_policy):
    if not (_STATE["fast"] and _fast_store(ptrs, value, mask)):
        return STOCK["create_masked_store"](self, ptrs, value, mask, cache_policy)


def _store(self, ptr, val, cache_policy):
    if not (_STATE["fast"] and _fast_store(ptr, val, None)):
        return STOCK["create_store"](self, ptr, val, cache_policy)


# With no observer each method is one dict look-up more than its own path.


def _create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
    fn = _STATE["observer"]
    if fn is None:
        return _masked_load(self, ptrs, mask, other, cache_policy, is_volatile)
    return fn(Access("load", ptrs, mask),
              lambda: _masked_load(self, ptrs, mask, other, cache_policy, is_volatile))


def _create_load(self, ptr, cache_policy, is_volatile):
    fn = _STATE["observer"]
    if fn is None:
        return _load(self, ptr, cache_policy, is_volatile)
    return fn(Access("load", ptr), lambda: _load(self, ptr, cache_policy, is_volatile))


def _create_masked_store(self, ptrs, value, mask, cache_policy):
    fn = _STATE["observer"]
    if fn is None:
        return _masked_store(self, ptrs, value, mask, cache_policy)
    return fn(Access("store", ptrs, mask, value=value),
              lambda: _masked_store(self, ptrs, value, mask, cache_policy))


def _create_store(self, ptr, val, cache_policy):
    fn = _STATE["observer"]
    if fn is None:
        return _store(self, ptr, val, cache_policy)
    return fn(Access("store", ptr, value=val), lambda: _store(self, ptr, val, cache_policy))


def _create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):  # noqa: N803 (Triton's name)
    fn = _STATE["observer"]
    stock = STOCK["create_atomic_rmw"]
    if fn is None:
        return stock(self, rmwOp, ptr, val, mask, sem, scope)
    return fn(Access("atomic_rmw", ptr, mask, sem=sem, op=rmwOp, value=val),
              lambda: stock(self, rmwOp, ptr, val, mask, sem, scope))


def _create_atomic_cas(self, ptr, cmp, val, sem, scope):
    fn = _STATE["observer"]
    stock = STOCK["create_atomic_cas"]
    if fn is None:
        return stock(self, ptr, cmp, val, sem, scope)
    return fn(Access("atomic_cas", ptr, sem=sem, value=val, cmp=cmp),
              lambda: stock(self, ptr, cmp, val, sem, scope))


PATCHES = {
    "create_masked_load": (_create_masked_load,
                           ["self", "ptrs", "mask", "other", "cache_policy", "is_volatile"]),
    "create_load": (_create_load, ["self", "ptr", "cache_policy", "is_volatile"]),
    "create_masked_store": (_create_masked_store,
                            ["self", "ptrs", "value", "mask", "cache_policy"]),
    "create_store": (_create_store, ["self", "ptr", "val", "cache_policy"]),
    "create_atomic_rmw": (_create_atomic_rmw,
                          ["self", "rmwOp", "ptr", "val", "mask", "sem", "scope"]),
    "create_atomic_cas": (_create_atomic_cas, ["self", "ptr", "cmp", "val", "sem", "scope"]),
}


def compatible(ti) -> str:
    """"" if the six methods have the signatures written against, else which does not."""
    builder = getattr(ti, "InterpreterBuilder", None)
    for name, (_, params) in PATCHES.items():
        fn = getattr(builder, name, None)
        if fn is None or list(inspect.signature(STOCK.get(name, fn)).parameters) != params:
            return f"{name} has another signature"
    return ""


def install() -> bool:
    """Replace the six access methods (idempotent); False, stock kept, if they differ."""
    if _STATE["installed"]:
        return True
    from triton.runtime import interpreter as ti

    if compatible(ti):
        return False
    for name, (fn, _) in PATCHES.items():
        capture(ti.InterpreterBuilder, name)
        setattr(ti.InterpreterBuilder, name, fn)
    _STATE["installed"] = True
    return True


def installed() -> bool:
    return _STATE["installed"]
