"""Host twins: a kernel's algorithm written as host code over the same memory, run in
place of the interpreter while no checker watches.

Triton's interpreter costs tens of microseconds per operation, so a collective that
moves 256 KiB spends ~20 ms of CPU per rank in Python plumbing (4 ranks on 2 cores:
~45 ms a call). A twin performs the same loads, stores and signals (same buffers,
flags, epochs and order) with a few numpy/torch calls and host atomics, so a twin and
the kernel interoperate call by call and rank by rank.

The interpreter runs the kernel itself whenever something checks it: a launch, program,
switch, memory or wait observer is registered (``commlab.racecheck``), a schedule is
configured (``programs.configure``), or ``COMMLAB_CPU_TWINS=0``. The checks that are on
without a checker stay on in a twin: its waits register with ``blocked`` (the hang
report) and ask ``liveness`` (a lost peer, the timeout), and its peer addresses are
checked to lie in the heap (``hostmem``).

``register(kernel, twin)``: ``twin(grid, **args)`` gets the launch's grid (a 3-tuple)
and arguments by name (tensors as tensors, constexprs included) and returns False to
decline (the interpreter then runs the kernel), anything else once it ran the launch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from commlab import _config
from commlab._interpreter import host, hostmem, memory, programs

_TWINS: dict[tuple[str, str], Callable[..., object]] = {}
RAN: Counter = Counter()  # kernel name -> launches its twin ran (tests, introspection)


def register(kernel, twin: Callable[..., object]) -> None:
    """Run ``twin`` for launches of ``kernel`` (a ``@triton.jit`` function) when allowed."""
    fn = getattr(kernel, "fn", kernel)
    _TWINS[(fn.__module__, fn.__name__)] = twin


def lookup(fn) -> Callable[..., object] | None:
    """The twin for the interpreted function ``fn`` if one may run now, else None."""
    if not _TWINS:
        return None
    twin = _TWINS.get((getattr(fn, "__module__", ""), getattr(fn, "__name__", "")))
    if twin is None or checked():
        return None
    return twin


def checked() -> bool:
    """Whether anything watches interpreted kernels now (then kernels run interpreted);
    ``observe`` checks its launch observer before asking."""
    return (memory.observer() is not None
            or programs.OBSERVERS["program"] is not None
            or programs.OBSERVERS["switch"] is not None
            or programs.configured() or host.wait_observer() is not None
            or not _config.get("COMMLAB_CPU_TWINS"))


def run(twin: Callable[..., object], name: str, names: list[str], grid, args: tuple,
        kwargs: dict) -> bool:
    """Run a launch of kernel ``name`` (parameters ``names``) as ``twin``; False if the
    twin declined (a callable grid, a parameter left to its default, its own refusal)."""
    if callable(grid):
        return False
    if len(args) > len(names):
        return False
    named = dict(zip(names, args, strict=False))  # the rest come from kwargs
    for k in names[len(args):]:
        if k not in kwargs:
            return False
        named[k] = kwargs[k]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    try:
        ran = twin(grid, **named) is not False
    finally:
        hostmem.forget()
    if ran:
        RAN[name] += 1
    return ran
