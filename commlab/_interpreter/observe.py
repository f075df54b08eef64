"""Registration hooks for checkers that watch interpreted kernels (``commlab.racecheck``).

This package is layer 0 and imports nothing above it; a checker registers here:

- ``set_launch_observer(fn)``: every launch runs as ``fn(fn_name, grid, do)``, where
  ``do()`` runs the launch and returns its result (``fn`` calls it exactly once);
- ``set_program_observer(fn)``: ``fn((x, y, z))`` before each program instance runs;
- ``host.set_wait_observer`` (in ``host``): every host-side poll of a spin-wait;
- ``memory.set_observer``: every load, store and atomic.

``install()`` wraps the interpreter's launch and program-index methods once; with no
observer registered each costs one ``None`` check.
"""

from __future__ import annotations

_STATE = {"launch": None, "program": None, "installed": False}


def set_launch_observer(fn) -> None:
    _STATE["launch"] = fn


def set_program_observer(fn) -> None:
    _STATE["program"] = fn


def install() -> bool:
    """Wrap ``GridExecutor.__call__`` and ``InterpreterBuilder.set_grid_idx`` (idempotent)."""
    if _STATE["installed"]:
        return True
    from triton.runtime import interpreter as ti

    grid_cls, builder = getattr(ti, "GridExecutor", None), getattr(ti, "InterpreterBuilder", None)
    if grid_cls is None or builder is None or not hasattr(builder, "set_grid_idx"):
        return False
    grid_call, set_idx = grid_cls.__call__, builder.set_grid_idx

    def launch(self, *args, **kwargs):
        fn = _STATE["launch"]
        if fn is None:
            return grid_call(self, *args, **kwargs)
        return fn(self.fn, self.grid, lambda: grid_call(self, *args, **kwargs))

    def set_grid_idx(self, x, y, z):
        set_idx(self, x, y, z)
        fn = _STATE["program"]
        if fn is not None:
            fn((x, y, z))

    grid_cls.__call__, builder.set_grid_idx = launch, set_grid_idx
    _STATE["installed"] = True
    return True
