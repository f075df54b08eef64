"""``torch.profiler`` events of the "commlab" backend: one ``commlab:<op>`` per call, with
the input shapes, asynchronous, as gloo's ``gloo:<op>`` and NCCL's ``nccl:<op>`` are.

torch makes a backend's event in the C++ ``Work`` constructor (marked async, with the
inputs' shapes) and gives Python no other way to mark an event async with shapes. So:

- a call that goes to the fallback group is made under ``dist.record_comm``'s setting
  ("commlab:<op>"), so gloo's (or NCCL's) Work carries commlab's name;
- a call on commlab's kernels makes its event with a one-rank gloo Work of the same name
  and shapes (a broadcast of zero-stride stand-ins: no data is read or moved), beside
  which the profiler also shows that Work's own ``gloo:broadcast``.

Nothing of this runs unless a profiler records (one C call to ask).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._autograd import _profiler_enabled  # type: ignore[attr-defined]  # private, not in torch stubs (torch 2.13)
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]  # private, not in torch stubs (torch 2.13)
    _get_comm_profiling_name,
    _set_comm_profiling_name,
)

_SOLO: list = []  # the one-rank gloo group, made on first use


def enabled() -> bool:
    return bool(_profiler_enabled())


@contextlib.contextmanager
def titled(name: str):
    """Works made inside take ``name`` as their profiler title ("" for none)."""
    before = _get_comm_profiling_name()
    _set_comm_profiling_name(name)
    try:
        yield
    finally:
        _set_comm_profiling_name(before)


class Titled:
    """A fallback group whose calls make Works titled ``name``."""

    def __init__(self, pg, name: str):
        self._pg, self._name = pg, name

    def __getattr__(self, attr: str):
        method = getattr(self._pg, attr)

        def call(*args, **kwargs):
            with titled(self._name):
                return method(*args, **kwargs)

        return call


def record(name: str, tensors) -> None:
    """An async event ``name`` with the shapes of ``tensors`` (gloo's rule for lists: the
    shapes of the tensors equal to the first one's, as one coalesced event)."""
    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    stand_ins = [torch.zeros((), dtype=torch.uint8).expand(t.shape) for t in ts
                 if t.shape == ts[0].shape] if ts else []
    if not _SOLO:
        _SOLO.append(dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60)))
    with titled(name):
        work = _SOLO[0].broadcast(stand_ins, dist.BroadcastOptions()) if stand_ins \
            else _SOLO[0].barrier(dist.BarrierOptions())
    work.wait()
