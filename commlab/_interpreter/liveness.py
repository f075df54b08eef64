"""A watch for waits inside interpreted kernels: the runtime registers a check that raises
when a peer died or the wait outlasted the communicator's timeout; ``host_wait`` calls
``check`` each time it gives up. Checks run at most every 50 ms of one wait; each thread
keeps its own wait (programs of a cooperative launch are threads, see ``programs``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

CHECK_EVERY_S = 0.05

_watch: Callable[[float], None] | None = None
_local = threading.local()  # .state: [(address, value) waited on, since, next check]


def set_watch(fn: Callable[[float], None] | None) -> None:
    """Install ``fn(seconds_waited)`` (None removes it); it raises to end the wait."""
    global _watch
    _watch = fn
    _local.state = [None, 0.0, 0.0]


def current() -> Callable[[float], None] | None:
    """The installed watch (the runtime's agreement also asks it which peers died)."""
    return _watch


def check(addr: int, want: int) -> None:
    """Called while waiting for the int32 at ``addr`` to reach ``want``."""
    if _watch is None:
        return
    now, key = time.monotonic(), (addr, want)
    state = getattr(_local, "state", None)
    if state is None:
        state = _local.state = [None, 0.0, 0.0]
    if state[0] != key:
        state[:] = [key, now, now + CHECK_EVERY_S]
        return
    if now >= state[2]:
        state[2] = now + CHECK_EVERY_S
        _watch(now - state[1])
