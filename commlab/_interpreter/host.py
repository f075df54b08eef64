"""Host-side help for the device language's spin-waits under the interpreter.

``commlab.language`` calls these inside ``if INTERPRET:`` branches of its spin loops.
Ranks often outnumber cores (4 ranks on a 2-core laptop or CI box), so a waiting rank
must give its core to the ranks it waits for. Compiled, the branch is never generated,
but Triton's dependency scan still resolves the names, so they are ``@triton.jit``
stubs there.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import triton

from commlab._interpreter import blocked, liveness, programs
from commlab._interpreter.choose import interpreting

_WAITS = [None]  # the registered wait observer (racecheck), or None


def set_wait_observer(fn) -> None:
    """``fn(event, addr, value)`` on every spin-wait: ``"begin"`` when ``cl.wait`` starts
    (the int32 address and the value it waits for), ``"poll"`` at each host-side poll
    (``addr`` None for the barrier's). It may raise to end the wait."""
    _WAITS[0] = fn


def wait_observer():
    """The registered wait observer, or None."""
    return _WAITS[0]


def _scalar(h):
    a = np.asarray(getattr(h, "data", h))
    return int(a.flat[0]) if a.size == 1 else None


def _value(v):
    h = getattr(v, "handle", None)
    return _scalar(h if h is not None else getattr(v, "value", v))


if interpreting():

    def host_wait_begin(ptr, value):
        """Tell a wait observer what ``cl.wait`` waits for (no-op without one)."""
        fn = _WAITS[0]
        if fn is not None:
            want = getattr(value, "handle", None)
            fn("begin", _scalar(ptr.handle), _scalar(want if want is not None
                                                     else getattr(value, "value", value)))
    _spin = [0, 0.0]  # consecutive spins, time of the last one

    def host_yield(ptr=None, want=None):
        """Give the core to the ranks we wait for: after a short burst of sched_yield
        the waiter sleeps, progressively longer, instead of spinning. ``ptr``/``want``:
        the barrier mailbox polled and the value it must hold (for the hang report)."""
        if _WAITS[0] is not None:
            _WAITS[0]("poll", None, None)
        addr = val = None
        if ptr is not None:
            addr, val = _scalar(ptr.handle), _value(want)
            if addr is not None and val is not None:
                blocked.poll(addr, val, "==", "barrier", programs.current())
        liveness.check(addr or 0, val or 0)  # a dead or silent peer raises here too
        if programs.blocked():  # other programs of this launch ran meanwhile: re-poll
            return
        now = time.perf_counter()
        if now - _spin[1] > 0.005:  # a new wait began
            _spin[0] = 0
        _spin[1] = now
        _spin[0] += 1
        if _spin[0] < 20:
            os.sched_yield()
        else:
            time.sleep(0.0001 if _spin[0] < 200 else 0.0005)

    def host_wait(ptr, value):
        """Wait for the int32 at ``ptr`` to reach ``value`` reading it straight from
        memory (a microsecond a look, against ~100 us for an interpreted atomic, and no
        CPU taken from the ranks we wait for). A hint only: it gives up after 2 ms, and
        the caller's atomic re-reads the flag (acquire) either way."""
        if _WAITS[0] is not None:
            _WAITS[0]("poll", _scalar(ptr.handle), None)
        addr, want = ptr.handle.data, getattr(value, "handle", None)
        want = want.data if want is not None else np.asarray(getattr(value, "value", value))
        if addr.size != 1 or want.size != 1:
            return host_yield()
        cell, want = ctypes.c_int32.from_address(int(addr.flat[0])), int(want.flat[0])
        blocked.poll(int(addr.flat[0]), want, ">=", "wait", programs.current())
        if cell.value >= want or programs.blocked((int(addr.flat[0]), want)):
            return  # there, or other programs of this launch ran meanwhile: re-poll
        give_up, spin = time.perf_counter() + 0.002, 0
        while cell.value < want and time.perf_counter() < give_up:
            if spin < 10:
                os.sched_yield()
            else:
                time.sleep(0.00005)
            spin += 1
        if cell.value < want:
            liveness.check(int(addr.flat[0]), want)  # a dead or silent peer raises here

else:

    @triton.jit
    def host_wait_begin(ptr, value):  # compiled: never reached
        pass

    @triton.jit
    def host_yield(ptr, want):  # compiled: never reached (INTERPRET is False)
        pass

    @triton.jit
    def host_wait(ptr, value):  # compiled: never reached either
        pass
