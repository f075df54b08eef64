"""Nested ``@triton.jit`` calls under the interpreter skip Triton's re-patching.

Triton's interpreter patches ``triton.language`` when a launch starts and, again, on
*every* call of one @triton.jit function from another (``cl.symm_at``, ``cl.wait``…
inside a kernel's loops): 36-46% of a CPU all-reduce's time (cProfile). Here a nested
call patches only the first time, per launch, that a helper names a language module
(``triton.language`` or ``triton.language.core``) not yet patched in this launch; later
calls skip it. Applied only when the interpreter has the shape this was written against
(Triton 3.x); ``COMMLAB_INTERPRETER_FASTCALL=0`` turns it off.
"""

from __future__ import annotations

import threading

from commlab import _config

_DEPTH = threading.local()  # per thread: launches entered, language modules patched


def launch_state() -> tuple:
    """This thread's launch state, for a program thread of the same launch (``programs``)."""
    return getattr(_DEPTH, "n", 0), getattr(_DEPTH, "patched", None)


def adopt(state: tuple) -> None:
    """Make the calling thread share a launch's state (from ``launch_state``)."""
    _DEPTH.n, _DEPTH.patched = state


def install() -> bool:
    """Patch the interpreter's launch and nested-call paths; return whether it is on."""
    import triton.language as tl
    from triton.runtime import interpreter as ti

    fn_cls, grid_cls = getattr(ti, "InterpretedFunction", None), getattr(ti, "GridExecutor", None)
    if (fn_cls is None or grid_cls is None or not hasattr(fn_cls, "rewrite")
            or not hasattr(ti, "_patch_lang")
            or not _config.get("COMMLAB_INTERPRETER_FASTCALL")):
        return False
    if getattr(fn_cls.__call__, "_commlab", False):
        return True
    depth = _DEPTH
    grid_call, nested_call = grid_cls.__call__, fn_cls.__call__
    langs = (tl, tl.core)

    def launch(self, *args, **kwargs):
        saved = getattr(depth, "patched", None)
        depth.n = getattr(depth, "n", 0) + 1
        depth.patched = set()  # language modules patched during this launch
        try:
            return grid_call(self, *args, **kwargs)
        except ti.InterpreterError as e:
            root = _commlab_root(e)
            if root is None:
                raise
            raise root from None  # commlab's own error (a dead peer, the timeout) as itself
        finally:
            depth.n -= 1
            depth.patched = saved

    def call(self, *args, **kwargs):
        if getattr(depth, "n", 0) == 0:
            return nested_call(self, *args, **kwargs)
        mods = getattr(self, "_commlab_langs", None)
        if mods is None:  # which language modules this helper's globals name
            mods = self._commlab_langs = frozenset(
                id(v) for v in self.fn.__globals__.values() if any(v is m for m in langs))
        if not mods <= depth.patched:  # first helper of this launch seeing these modules
            ti._patch_lang(self.fn)
            depth.patched |= mods
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    call._commlab = True  # type: ignore[attr-defined]  # marks our wrapper (installed once)
    grid_cls.__call__, fn_cls.__call__ = launch, call
    return True


def _commlab_root(e: BaseException) -> BaseException | None:
    """The CommlabError an interpreted kernel raised under Triton's InterpreterError
    wrappers (one per nested call), or None."""
    from commlab.errors import CommlabError

    seen = 0
    while e is not None and seen < 64:
        if isinstance(e, CommlabError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1  # type: ignore[assignment]
    return None
