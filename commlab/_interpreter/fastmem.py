"""Interpreter speed-up: index blocks stay symbolic, contiguous loads and stores are slices.

Triton's interpreter runs every block op as a numpy call on whole arrays. The index
arithmetic of a typical kernel line

    offs = start + tl.arange(0, BLOCK);  mask = offs < N
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

costs about ten of them (the int32 add is checked for overflow in int64: a cast, an
add, two compares, an and), and then ``load``/``store`` gather and scatter element by
element through a [BLOCK] array of uint64 addresses. For a CPU all-reduce of 1M floats
that was most of the time.

``blocks`` keeps index blocks symbolic; ``memory`` turns loads and stores through
them into slice copies. ``install()`` here patches only the Triton interpreter it was
written against (3.x, method signatures checked), runs ``selfcheck`` against the
stock builder and leaves the stock path in place, with a warning, if anything
differs. ``COMMLAB_INTERPRETER_FASTMEM=0`` turns it off.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings

from commlab import _config
from commlab._interpreter import blocks, memory, selfcheck
from commlab._interpreter.stock import STOCK, capture

_INSTALLED: list = []  # names patched by install(), in order


def _skip_dead_overflow_checks(ti) -> bool:
    """Integer ``+ - *`` on the interpreter compute an int64 overflow condition (a cast,
    the op, two compares, an and: ~8 interpreted ops per scalar add) and hand it to
    ``device_assert``, which returns at once unless the options ask for debug. Skip
    the computation in exactly that case; with debug on, the stock check runs."""
    sem = getattr(ti, "interpreter_semantic", None)
    if sem is None:  # a Triton without it: nothing to skip
        return False
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

    sem.binary_op_sanitize_overflow_impl = sanitize
    _INSTALLED.append("sanitize")
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
    targets = [(builder, n, p) for n, (_, p) in blocks.PATCHES.items()]
    targets += [(ti, n, p) for n, (_, p) in blocks.MODULE_PATCHES.items()]
    for obj, name, params in targets:
        fn = STOCK.get(name) or getattr(obj, name, None)
        if fn is None or list(inspect.signature(fn).parameters) != params:
            return f"{name} has another signature"
    why = memory.compatible(ti)
    if why:
        return why
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
    if _INSTALLED:
        return True
    if not _config.get("COMMLAB_INTERPRETER_FASTMEM"):
        return False
    from triton.runtime import interpreter as ti

    why = _compatible(ti)
    if why:
        warnings.warn(f"commlab: interpreter fast path off: {why}; the CPU backend runs "
                      "on the stock interpreter (slower, same results)", RuntimeWarning,
                      stacklevel=2)
        return False
    memory.install()  # the six access methods (also on without the fast path)
    for name, (fn, _) in blocks.PATCHES.items():
        capture(ti.InterpreterBuilder, name)
        setattr(ti.InterpreterBuilder, name, fn)
        _INSTALLED.append(name)
    for name, (fn, _) in blocks.MODULE_PATCHES.items():
        capture(ti, name, module=True)
        setattr(ti, name, fn)
        _INSTALLED.append(name)
    memory.set_fast(True)
    _skip_dead_overflow_checks(ti)
    try:
        problem = selfcheck.self_check(ti)
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
    """Put the stock index arithmetic and loads/stores back (tests compare against it).
    The access methods stay replaced, on their stock path: observers keep working."""
    if not _INSTALLED:
        return
    from triton.runtime import interpreter as ti

    memory.set_fast(False)
    for name in _INSTALLED:
        if name == "sanitize":  # the instance attribute shadowed the class's method
            del ti.interpreter_semantic.binary_op_sanitize_overflow_impl
        elif name in blocks.MODULE_PATCHES:
            setattr(ti, name, STOCK[name])
        else:
            setattr(ti.InterpreterBuilder, name, STOCK[name])
    _INSTALLED.clear()


def installed() -> bool:
    return bool(_INSTALLED)
