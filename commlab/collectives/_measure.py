"""Around every collective launch: note which call records it opens, label it for
torch.profiler (``commlab:<op>`` with shapes, bytes and algorithm), span it for a trace.

Cost when no trace or profiler runs: two reads of the record counter and one append
(CPU: the counter is in shared memory; GPU: a host count of recording launches).
"""

from __future__ import annotations

import torch

from commlab.runtime import records as _records
from commlab.trace import collective as _span
from commlab.trace import needed as _tracing


class Measured:
    """Context manager for one collective call's launches."""

    __slots__ = ("book", "op", "nbytes", "algorithm", "dtype", "k0", "inner", "meta")

    def __init__(self, book, op: str, nbytes: int, algorithm: str, device, x, meta):
        self.book, self.op, self.nbytes, self.algorithm = book, op, nbytes, algorithm
        self.dtype = str(x.dtype).replace("torch.", "") if isinstance(x, torch.Tensor) else ""
        self.meta = meta
        self.inner = None
        if _tracing():
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else ()
            self.inner = _span(op, nbytes, algorithm, device, shape=shape, dtype=self.dtype)
        self.k0 = 0

    def __enter__(self):
        if self.book is not None:
            self.k0 = self.book.mark()
        if self.inner is not None:
            self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        if self.inner is not None:
            self.inner.__exit__(*exc)
        if self.book is not None and exc[0] is None:
            self.book.note(self.k0, self.book.mark(), self.op, self.algorithm, self.nbytes,
                           self.dtype, self.meta)
        return False


def measured(comm, op: str, nbytes: int, algorithm: str, device, x=None,
             meta: dict | None = None):
    """The context for one call, or None when there is nothing to do (no records, no
    trace, no profiler)."""
    book = _records.book(comm)  # None when records are off (it reads the setting once)
    if book is None and not _tracing():
        return None
    return Measured(book, op, nbytes, algorithm, device, x, meta)
