"""Rank functions for tests/test_torch_edges.py: what torch's own distributed tests found
on the "commlab" backend (tests/torch_suite), each checked against gloo in the same world:
empty tensors of every dtype, sparse tensors, the group's timeout and a missing rank,
monitored_barrier, and the profiler's ``commlab:<op>`` events."""

from __future__ import annotations

import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.float64, torch.int8, torch.uint8, torch.bool, torch.complex64]


def _start():
    dist.init_process_group("commlab")
    return dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo")


def _ops(W: int, dtype: torch.dtype, shape: tuple, group) -> dict:
    """Every collective on an empty tensor of ``dtype``: the outputs' shapes and dtypes."""
    op = R.MAX if dtype == torch.bool else R.SUM
    out = {}

    def e(*s):
        return torch.empty(s if s else shape, dtype=dtype)

    t = e()
    dist.all_reduce(t, op=op, group=group)
    out["all_reduce"] = t
    dist.broadcast(t, 0, group=group)
    out["broadcast"] = t
    g = e(W * shape[0], *shape[1:])
    dist.all_gather_into_tensor(g, e(), group=group)
    out["all_gather_into_tensor"] = g
    gl = [e() for _ in range(W)]
    dist.all_gather(gl, e(), group=group)
    out["all_gather"] = torch.stack(gl)
    if dtype != torch.bool:
        rs = e()
        dist.reduce_scatter_tensor(rs, e(W * shape[0], *shape[1:]), group=group)
        out["reduce_scatter_tensor"] = rs
    a2a = e(W * shape[0], *shape[1:])
    dist.all_to_all_single(a2a, e(W * shape[0], *shape[1:]), group=group)
    out["all_to_all_single"] = a2a
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in out.items()}


def empty_world(comm) -> dict:
    """Every dtype, 1-D and 2-D empty tensors, on commlab and on gloo; then a real call."""
    rank, W, gloo = _start()
    got, errors = {}, []
    for dtype in DTYPES:
        for shape in [(0,), (0, 3)]:
            key = f"{dtype}{shape}"
            try:
                got[key] = (_ops(W, dtype, shape, None), _ops(W, dtype, shape, gloo))
            except Exception as ex:  # noqa: BLE001  (reported with the dtype and shape)
                errors.append(f"{key}: {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    return {"got": got, "errors": errors, "after": t.tolist()}
