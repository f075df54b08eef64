"""The Work a commlab collective returns: already done on the host, ordered on the stream.

commlab's kernels run on the caller's current stream (CPU: they have finished when the
call returns), so the Work is complete at once. On CPU it is a ``Done``: nothing but the
result until someone asks for its future (DDP, ``async_op=True`` callers), which is then
made once; a sync ``dist.*`` call only calls ``wait()``. On CUDA the Work's Future records
an event on the current stream when the call returns, so ``wait()`` and ``get_future()``
callbacks order later work after the kernels exactly as NCCL's Work does. A blocking
``dist.*`` call (``async_op=False``) only waits on its Work, so it gets ``FINISHED``, one
shared finished Work (on CUDA the kernels are already ordered on the caller's stream).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # private, not in torch stubs (torch 2.13)
from torch.futures import Future


class Done(dist.Work):
    """A finished CPU call's Work (PyTorch's ``test_c10d_pypg`` contract): ``wait()``
    returns True, ``get_future()`` holds ``result``."""

    def __init__(self, result):
        super().__init__()
        self._result = result
        self._future: Future | None = None

    def wait(self, timeout=None) -> bool:
        return True

    def get_future(self) -> Future:
        if self._future is None:
            fut: Future[object] = Future()
            fut.set_result(self._result)
            self._future = fut
        return self._future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self):
        return self._result


FINISHED = Done(None)  # what every blocking call returns (torch only waits on it)


def completed(result, device: torch.device | None = None) -> dist.Work:
    """A Work whose ``wait()`` returns True and whose future holds ``result``."""
    if device is not None and device.type == "cuda":
        fut: Future[object] = Future(devices=[device])
        fut.set_result(result)
        return _create_work_from_future(fut)
    return Done(result)
