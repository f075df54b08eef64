"""``torch.profiler`` events of the "commlab" backend: one ``commlab:<op>`` per call, with
the input shapes, asynchronous, as gloo's ``gloo:<op>`` and NCCL's ``nccl:<op>`` are.

torch makes a backend's event in the C++ ``Work`` constructor (marked async, with the
inputs' shapes) and gives Python no other way to mark an event async with shapes. So:

- a call that goes to the fallback group is made under ``dist.record_comm``'s setting
  ("commlab:<op>"), so gloo's (or NCCL's) Work carries commlab's name;
- a call on commlab's kernels makes its event with a one-rank gloo Work of the same name
  and shapes (a broadcast of zero-stride stand-ins, so no data is read or moved; a
  coalesced call of unequal shapes uses one byte per element), beside which the profiler
  also shows that Work's own ``gloo:broadcast`` (or ``gloo:allreduce``).

The names are gloo's: ``all_reduce`` (also for ``all_reduce_coalesced``), ``broadcast``,
``all_gather`` (list and coalesced forms), ``all_gather_into_tensor``,
``reduce_scatter``, ``reduce_scatter_tensor``, ``all_to_all``, ``barrier``, ``send``,
``recv``, ``gather``, ``scatter``, ``reduce``.

Nothing of this runs unless a profiler records (one C call to ask). A torch without the
profiling-name calls (2.11 has none; they came later) gets a plain ``record_function``
range named ``commlab:<op>`` instead: same name, on the CPU thread, without shapes.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch._C._autograd import _profiler_enabled

# None on an older torch: events become record_function ranges (module docstring)
_get_comm_profiling_name = getattr(_c10d, "_get_comm_profiling_name", None)
_set_comm_profiling_name = getattr(_c10d, "_set_comm_profiling_name", None)

_SOLO: list = []  # the one-rank gloo group, made on first use


def enabled() -> bool:
    return bool(_profiler_enabled())


@contextlib.contextmanager
def titled(name: str):
    """Works made inside take ``name`` as their profiler title ("" for none)."""
    if _set_comm_profiling_name is None or _get_comm_profiling_name is None:
        with torch.profiler.record_function(name) if name and enabled() \
                else contextlib.nullcontext():
            yield
        return
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
    """An async event ``name`` with the shapes of ``tensors``."""
    shapes = [t.shape for t in tensors if isinstance(t, torch.Tensor)]
    if _set_comm_profiling_name is None:
        with torch.profiler.record_function(name):
            return
    if not _SOLO:
        _SOLO.append(dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60)))
    solo = _SOLO[0]
    with titled(name):
        if not shapes:
            work = solo.barrier(dist.BarrierOptions())
        elif len(set(shapes)) == 1:  # zero-stride stand-ins: nothing allocated or moved
            one = torch.zeros((), dtype=torch.uint8)
            work = solo.broadcast([one.expand(s) for s in shapes], dist.BroadcastOptions())
        else:  # shapes differ (a coalesced call): one byte per element, profiling only
            work = solo.allreduce_coalesced([torch.empty(s, dtype=torch.uint8) for s in shapes],
                                            dist.AllreduceCoalescedOptions())
    work.wait()
