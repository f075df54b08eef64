"""Tracing: spans for commlab's collectives and for compute you mark yourself.

    commlab.trace.start()
    with commlab.trace.span("gemm"):
        y = a @ b
    z = commlab.all_reduce(y)          # recorded as a "comm" span, with bytes and algorithm
    spans = commlab.trace.stop()       # list[Span], microseconds since start()
"""

from __future__ import annotations

from commlab.trace._recorder import RECORDER, Span


def start(rank: int | None = None) -> None:
    """Begin recording spans on this rank."""
    if rank is None:
        from commlab.runtime.communicator import _COMM

        rank = _COMM.rank if _COMM is not None else 0
    RECORDER.start(rank)


def stop() -> list[Span]:
    """End the recording and return its spans."""
    return RECORDER.stop()


def span(name: str, kind: str = "compute", **kw):
    """Mark a region (default kind "compute") while a recording is active."""
    return RECORDER.span(name, kind, **kw)


def collective(op: str, nbytes: int, algorithm: str, device=None):
    """Used by commlab's collectives: a "comm" span with the bytes moved and algorithm."""
    return RECORDER.span(op, "comm", bytes=nbytes, algorithm=algorithm, device=device)


def is_recording() -> bool:
    return RECORDER.active


__all__ = ["Span", "collective", "is_recording", "span", "start", "stop"]
