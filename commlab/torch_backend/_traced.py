"""Around every method of the "commlab" group: the call in progress, its profiler event,
the group's timeout, a trace span, and which route it took (``ROUTES``).

Without a profiler or a ``commlab.trace`` recording, a method costs two saved and
restored globals (the call and ``CALL_TIMEOUT``), no context manager.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter

from torch._C._autograd import _profiler_enabled

from commlab import trace
from commlab.runtime._control import CALL_TIMEOUT
from commlab.torch_backend import _profile
from commlab.trace import RECORDER as _RECORDER

ROUTES: Counter = Counter()  # (route, method) -> calls; route "kernel" or "fallback"
_NO_EVENT = contextlib.nullcontext()  # no profiler: nothing to name (one C call to ask)


class _Call(threading.local):
    """The call in progress on this thread: (method, event, inputs, args, route key of
    a kernel call, profiler on), or None."""

    call: tuple | None = None


CALL = _Call()


def traced(event: str, inputs=lambda args: args[0]):
    """Around a method: remember the call for its profiler event ``commlab:<event>``
    (the fallback's Works take the name; a native call's is recorded with the shapes of
    ``inputs(args)``), the group's timeout over its waits, and a "dist" span (waiting
    for late ranks included) while a ``commlab.trace`` records: what ``commlab.watch``
    counts as communication. The method's name, less leading underscores, names the
    call (``ROUTES``' key, ``dist.<name>`` in errors)."""

    def decorate(method):
        name = method.__name__.lstrip("_")
        kernel = ("kernel", name)  # its ROUTES key, made once

        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            if self.retired:
                from commlab.errors import CommlabUsageError

                raise CommlabUsageError(f"dist.{name}: {self.retired}")
            before = CALL.call
            profiling = _profiler_enabled()
            CALL.call = (name, event, inputs, args, kernel, profiling)
            limit = CALL_TIMEOUT[0]  # call_timeout(self.timeout_s), inlined
            CALL_TIMEOUT[0] = self.timeout_s
            try:
                if not (profiling or _RECORDER.active):
                    return method(self, *args, **kwargs)
                with trace.event_named_outside() if _profile.enabled() else _NO_EVENT:
                    if not trace.is_recording():
                        return method(self, *args, **kwargs)
                    with trace.span(name, kind="dist"):
                        return method(self, *args, **kwargs)
            finally:
                CALL_TIMEOUT[0] = limit
                CALL.call = before

        return wrapper

    return decorate


def route(route: str) -> tuple | None:
    """Count the call in progress as taking ``route``; the call, or None."""
    call = CALL.call
    if call is not None:
        ROUTES[(route, call[0])] += 1
    return call
