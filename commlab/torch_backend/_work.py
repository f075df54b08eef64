"""The Work a commlab collective returns: already done on the host, ordered on the stream.

commlab's kernels run on the caller's current stream (CPU: they have finished when the
call returns), so the Work is complete at once; on CUDA its Future records an event on
the current stream, so ``wait()`` and ``get_future()`` callbacks order later work after
the kernels exactly as NCCL's Work does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # private, not in torch stubs (torch 2.13)
from torch.futures import Future


def completed(result, device: torch.device | None = None) -> dist.Work:
    """A Work whose ``wait()`` returns True and whose future holds ``result``."""
    if device is not None and device.type == "cuda":
        fut: Future[object] = Future(devices=[device])
    else:
        fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)
