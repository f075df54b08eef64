"""A watch for waits inside interpreted kernels: the runtime registers a check that raises
when a peer died or the wait outlasted the communicator's timeout; ``host_wait`` calls
``check`` each time it gives up. Checks run at most every 50 ms of one wait."""

from __future__ import annotations

import time
from collections.abc import Callable

CHECK_EVERY_S = 0.05

_watch: Callable[[float], None] | None = None
_state: list = [None, 0.0, 0.0]  # (address, value) waited on, since, next check


def set_watch(fn: Callable[[float], None] | None) -> None:
    """Install ``fn(seconds_waited)`` (None removes it); it raises to end the wait."""
    global _watch
    _watch = fn
    _state[0] = None


def check(addr: int, want: int) -> None:
    """Called while waiting for the int32 at ``addr`` to reach ``want``."""
    if _watch is None:
        return
    now, key = time.monotonic(), (addr, want)
    if _state[0] != key:
        _state[:] = [key, now, now + CHECK_EVERY_S]
        return
    if now >= _state[2]:
        _state[2] = now + CHECK_EVERY_S
        _watch(now - _state[1])
