"""Kernel launches with a few microseconds of Python, for latency-bound collectives.

``kernel[grid](...)`` re-derives Triton's specialisation key on every call (tens of
microseconds for a collective's argument list). On CUDA we key our own cache by what
that specialisation depends on — tensor dtypes and 16-byte alignment, integers'
divisibility by 16, equality to 1 and 32/64-bit range, the constexprs and num_warps —
and launch the cached CompiledKernel directly. The interpreter (CPU backend) always
takes the ordinary path. ``COMMLAB_FAST_LAUNCH=0`` turns the cache off.
"""

from __future__ import annotations

import torch

from commlab import _config
from commlab.runtime.records import launched, records_kernel

_FAST = _config.get("COMMLAB_FAST_LAUNCH")
_CACHE: dict = {}


def _spec(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return (a % 16 == 0, a == 1, -(1 << 31) <= a < (1 << 31))
    return type(a)


def launch(kernel, grid: tuple, args: tuple, consts: dict, *, num_warps: int = 4,
           backend: str = "cuda", record: list | None = None):
    """Launch ``kernel[grid](*args, **consts)``; constexprs must be the kernel's last
    parameters, in ``consts``' order. Returns the CompiledKernel on CUDA, else None.
    ``record``, if given, receives (compiled, grid, args, consts) for launch plans."""
    if backend != "cuda" or not _FAST:
        kernel[grid](*args, **consts, num_warps=num_warps)
        compiled = None
    else:
        key = (kernel, tuple(consts.items()), num_warps, tuple(_spec(a) for a in args))
        compiled = _CACHE.get(key)
        if compiled is None:
            compiled = _CACHE[key] = kernel[grid](*args, **consts, num_warps=num_warps)
        else:
            compiled[(grid + (1, 1))[:3]](*args, *consts.values())
    if records_kernel(kernel):
        launched()
    if record is not None:
        record.append((compiled, grid, args, consts))
    return compiled
