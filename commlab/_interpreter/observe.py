"""Registration hooks for checkers that watch interpreted kernels (``commlab.racecheck``).

This package is layer 0 and imports nothing above it; a checker registers here:

- ``set_launch_observer(fn)``: every launch runs as ``fn(fn_name, grid, do)``, where
  ``do()`` runs the launch and returns its result (``fn`` calls it exactly once);
- ``set_program_observer(fn)``: ``fn((x, y, z))`` before each program instance runs,
  ``set_switch_observer(fn)``: ``fn("out"|"in", (x, y, z))`` when a program of a
  cooperative launch hands the baton on and gets it back (``programs``);
- ``host.set_wait_observer`` (in ``host``): every host-side poll of a spin-wait;
- ``memory.set_observer``: every load, store and atomic.

``install()`` wraps the interpreter's launch once: with no launch observer a kernel
with a host twin that may run (``twins``) runs as its twin, any other launch runs its
programs through ``programs.run``.
"""

from __future__ import annotations

from commlab._interpreter import programs, twins

_STATE = {"launch": None, "installed": False}


def set_launch_observer(fn) -> None:
    _STATE["launch"] = fn


def set_program_observer(fn) -> None:
    programs.OBSERVERS["program"] = fn


def set_switch_observer(fn) -> None:
    programs.OBSERVERS["switch"] = fn


def install() -> bool:
    """Wrap ``GridExecutor.__call__`` (idempotent)."""
    if _STATE["installed"]:
        return True
    from triton.runtime import interpreter as ti

    grid_cls, builder = getattr(ti, "GridExecutor", None), getattr(ti, "InterpreterBuilder", None)
    if grid_cls is None or builder is None or not hasattr(builder, "set_grid_idx"):
        return False
    grid_call = grid_cls.__call__

    def launch(self, *args, **kwargs):
        fn = _STATE["launch"]
        if fn is None:
            return programs.run(self, grid_call, args, kwargs)
        return fn(self.fn, self.grid, lambda: programs.run(self, grid_call, args, kwargs))

    grid_cls.__call__ = launch
    fn_cls = getattr(ti, "InterpretedFunction", None)
    if fn_cls is not None and hasattr(fn_cls, "run"):
        _install_twins(fn_cls)
    _STATE["installed"] = True
    return True


def _install_twins(fn_cls) -> None:
    """Launches of a kernel with a host twin that may run (``twins``) run as the twin,
    before Triton builds its GridExecutor (tens of microseconds a launch)."""
    stock_run = fn_cls.run

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup and _STATE["launch"] is None:
            twin = twins.lookup(self.fn)
            if twin is not None and twins.run(twin, self.fn.__name__, self.arg_names, grid,
                                              args, kwargs):
                return None
        return stock_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    fn_cls.run = run
