"""Where a world across hosts leaves the one-host path: the public entries ask
``spans_hosts(comm)`` and hand the call to the hierarchical version registered here
(``collectives._hier``, imported by the facade, and ``overlap._hier``, by its package,
register theirs), so the one-host path never imports the hierarchy built on top of it."""

from __future__ import annotations

from collections.abc import Callable

_OPS: dict[str, Callable] = {}


def install(name: str, fn: Callable) -> None:
    """Run ``fn(*args)`` for the public op ``name`` in a world across hosts."""
    _OPS[name] = fn


def spans_hosts(comm) -> bool:
    """True when ``comm``'s ranks live on more than one host."""
    return comm.local is not comm


def run(name: str, *args):
    return _OPS[name](*args)
