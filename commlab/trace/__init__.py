"""Tracing: spans for commlab's collectives and for compute you mark yourself.

    commlab.trace.start()
    with commlab.trace.span("gemm"):
        y = a @ b
    z = commlab.all_reduce(y)          # recorded as a "comm" span, with bytes and algorithm
    spans = commlab.trace.stop()       # list[Span], microseconds since start()

    commlab.trace.overlap_metrics(spans)            # per rank: overlap ratio, exposed comm
    commlab.trace.to_chrome_trace(spans, "t.json")  # open in ui.perfetto.dev
    commlab.trace.load_torch_trace("prof.json")     # torch.profiler trace -> spans
"""

from __future__ import annotations

import contextlib
import threading

import torch

from commlab.runtime import current_communicator
from commlab.trace._recorder import RECORDER, Span
from commlab.trace.arrivals import arrival_spans, straggler, straggler_text
from commlab.trace.chrome import classify, load_torch_trace, mark_communication, to_chrome_trace
from commlab.trace.overlap import OverlapMetrics, overlap_metrics, ratio_warnings


def start(rank: int | None = None) -> None:
    """Begin recording spans on this rank."""
    if rank is None:
        comm = current_communicator()
        rank = comm.rank if comm is not None else 0
    RECORDER.start(rank)


def stop() -> list[Span]:
    """End the recording and return its spans."""
    return RECORDER.stop()


def span(name: str, kind: str = "compute", **kw):
    """Mark a region (default kind "compute") while a recording is active."""
    return RECORDER.span(name, kind, **kw)


def _event(name: str, kw: dict):
    """A profiler event with ``kw`` as its args (exported with ``record_shapes=True``, as
    torch's own ops' input shapes are)."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is None:  # an older torch: the name only
        return torch.profiler.record_function(name)
    return fast(name, [], kw)


_OUTER = threading.local()  # .named: an enclosing call records the profiler event


@contextlib.contextmanager
def event_named_outside():
    """Collectives called inside make no ``commlab:<op>`` profiler event of their own:
    the caller records the call's event (the torch backend's, with torch's shapes), so a
    profile shows one event per call."""
    before = getattr(_OUTER, "named", False)
    _OUTER.named = True
    try:
        yield
    finally:
        _OUTER.named = before


@contextlib.contextmanager
def collective(op: str, nbytes: int, algorithm: str, device=None, *, shape=(), dtype=""):
    """Used by commlab's collectives: a "comm" span with the bytes moved and algorithm.
    Under torch.profiler the region is also an event ``commlab:<op>`` whose args name
    the shape, dtype, bytes and algorithm (exported with ``record_shapes=True``), so
    profiler traces (and HTA, through ``trace.mark_communication``) see commlab's
    communication by name."""
    if torch.autograd._profiler_enabled() and not getattr(_OUTER, "named", False):
        kw = {"shape": str(list(shape)), "dtype": dtype, "bytes": nbytes, "algorithm": algorithm}
        with _event(f"commlab:{op}", kw), \
                RECORDER.span(op, "comm", bytes=nbytes, algorithm=algorithm, device=device):
            yield
        return
    with RECORDER.span(op, "comm", bytes=nbytes, algorithm=algorithm, device=device):
        yield


def is_recording() -> bool:
    return RECORDER.active


def needed() -> bool:
    """Whether a collective should enter ``collective(...)``: a recording is active, or
    torch.profiler is running (then the region is the event ``commlab:<op>``)."""
    return RECORDER.active or torch.autograd._profiler_enabled()


__all__ = ["OverlapMetrics", "Span", "arrival_spans", "classify", "collective",
           "event_named_outside",
           "is_recording", "load_torch_trace", "mark_communication", "needed", "straggler",
           "straggler_text", "overlap_metrics", "ratio_warnings", "span", "start",
           "stop", "to_chrome_trace"]
