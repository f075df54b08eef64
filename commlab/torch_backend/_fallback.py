"""The fallback group: gloo (CPU tensors) and NCCL (CUDA tensors) over the same ranks;
where ranks share a GPU, which NCCL refuses, gloo on host copies (``_staged``).

What commlab does not run natively (point-to-point, sparse tensors, monitored_barrier,
uneven all-to-all, groups that are a strict subset of the world, CPU tensors in a CUDA
world) goes to these groups, each made from the commlab group's own store, so rank
numbers and options pass through unchanged.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from commlab.torch_backend._staged import HostStaged


class Fallback:
    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        self._store, self._rank, self._size, self._timeout = store, rank, size, timeout
        # gloo connects its full mesh now, while every rank of the group is here
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("commlab-fallback/gloo", store),
                                          rank, size, timeout)
        self._nccl = None

    def nccl(self):
        if self._nccl is None:  # NCCL makes its communicator on first use: lazy is safe
            if self._ranks_share_gpu():  # every rank asks here, in the same collective
                self._nccl = HostStaged(self.gloo, torch.device("cuda",
                                                                torch.cuda.current_device()))
                return self._nccl
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self._timeout
            self._nccl = dist.ProcessGroupNCCL(
                dist.PrefixStore("commlab-fallback/nccl", self._store), self._rank,
                self._size, opts)
        return self._nccl

    def _ranks_share_gpu(self) -> bool:
        from commlab.runtime._devices import Placement, identity

        store = dist.PrefixStore("commlab-fallback/gpus", self._store)
        store.set(str(self._rank), identity(torch.cuda.current_device()))
        return Placement(tuple(store.get(str(r)).decode() for r in range(self._size))).shared

    def for_tensors(self, *tensors):
        """The group for these tensors' device (the first tensor found decides)."""
        for t in _flat(tensors):
            if t.device.type == "cuda":
                return self.nccl()
            return self.gloo
        return self.gloo

    def shutdown(self) -> None:
        for pg in (self.gloo, self._nccl):
            if pg is not None and not isinstance(pg, HostStaged) and hasattr(pg, "shutdown"):
                try:
                    pg.shutdown()
                except Exception:  # an already broken group must not stop the rest
                    pass


def _flat(items):
    for x in items:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _flat(x)
