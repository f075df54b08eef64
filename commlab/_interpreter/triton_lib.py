"""Make Triton's own ``@jit`` helpers usable by interpreted kernels.

Triton decides compile-or-interpret when ``@triton.jit`` decorates. Its library helpers
(``tl.zeros``, ``tl.sum``, ``tl.max``, ``tl.cdiv``, ...) are decorated when
``triton.language`` is imported; a script that runs ``import triton`` *before*
``import commlab`` (which turns the interpreter on) gets compiled-mode helpers, and an
interpreted kernel calling one fails with "Cannot call @triton.jit'd outside of the
scope of a kernel". ``adopt()`` re-wraps those helpers for the interpreter, in place, so
every kernel (defined before or after) finds interpreter versions at call time.
"""

from __future__ import annotations

import sys


def adopt(all_modules: bool = False) -> int:
    """Re-wrap compiled-mode JITFunctions as interpreted ones when the interpreter is on;
    return how many were re-wrapped (0 when nothing to do). By default only
    triton.language's helpers; ``all_modules`` also re-wraps module-level kernels of
    every loaded module (a script that defined its kernels before ``import commlab``)."""
    from commlab._interpreter import choose

    if not choose.interpreting() or "triton.language" not in sys.modules:
        return 0
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    swapped: dict[int, InterpretedFunction] = {}
    for name, mod in list(sys.modules.items()):
        in_triton = name == "triton.language" or name.startswith("triton.language.")
        if mod is None or not (in_triton or (all_modules and not name.startswith("triton"))):
            continue
        for attr, value in list(vars(mod).items()):
            if issubclass(type(value), JITFunction):  # type(): no proxy __class__ lookups
                new = swapped.get(id(value))
                if new is None:
                    new = swapped[id(value)] = InterpretedFunction(value.fn)
                setattr(mod, attr, new)
    return len(swapped)
