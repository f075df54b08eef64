"""torch.distributed's ReduceOp on commlab: which ops the kernels run, the rest on the host.

SUM, MAX and MIN run in the kernels for float32/16, bfloat16 and int32 (floats
accumulate in fp32); AVG is SUM divided by the world size. PRODUCT, the bitwise ops,
and every op on other dtypes gather every rank's tensor (commlab's all-gather, bytes
bit-cast) and reduce on each rank in rank order, so all ranks get the same bits;
PREMUL_SUM (NCCL only) is refused, as gloo refuses it.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from commlab.torch_backend._bitcast import NATIVE

_NAMES = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.PRODUCT: "product", dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor", dist.ReduceOp.BXOR: "bxor",
}
_BY_TYPE = dict(_NAMES)  # RedOpType -> name; a ReduceOp is looked up by its .op
KERNEL_OPS = ("sum", "max", "min", "avg")
_SUM = dist.ReduceOp.SUM


def op_name(op) -> str:
    """The name of a ReduceOp ("sum", "avg", ...); ValueError for PREMUL_SUM."""
    if op == _SUM:  # the common case: one pybind comparison (.op and its hash cost 3 calls)
        return "sum"
    try:  # a ReduceOp carries its RedOpType in .op: one dict lookup (no pybind == per op)
        name = _BY_TYPE.get(getattr(op, "op", op))
    except TypeError:  # unhashable: not a ReduceOp
        name = None
    if name is not None:
        return name
    for k, v in _NAMES.items():  # anything else that compares equal to one
        if op == k:
            return v
    raise ValueError(
        f"commlab backend: ReduceOp {op} is not supported (PREMUL_SUM is NCCL's); "
        f"scale the tensor and use ReduceOp.SUM"
    )


def in_kernel(name: str, dtype: torch.dtype) -> bool:
    """Whether commlab's reduction kernels compute ``name`` on ``dtype``."""
    return name in KERNEL_OPS and dtype in NATIVE


def finish_avg(y: torch.Tensor, world_size: int) -> torch.Tensor:
    """AVG from a SUM (integers truncate toward zero)."""
    if y.is_floating_point() or y.is_complex():
        return y.div_(world_size)
    return torch.div(y, world_size, rounding_mode="trunc").to(y.dtype)


def reduce_rows(rows: torch.Tensor, name: str) -> torch.Tensor:
    """Reduce ``rows`` (``[W, ...]``, rank order) over dim 0 on the host."""
    if name in ("sum", "avg"):
        out = rows.any(0) if rows.dtype == torch.bool else rows.sum(0, dtype=rows.dtype)
        return finish_avg(out, rows.shape[0]) if name == "avg" else out
    if name == "max":
        return rows.amax(0)
    if name == "min":
        return rows.amin(0)
    if name == "product":
        return rows.all(0) if rows.dtype == torch.bool else rows.prod(0, dtype=rows.dtype)
    if rows.is_floating_point():
        raise ValueError(f"commlab backend: ReduceOp {name.upper()} needs an integer or bool "
                         f"tensor, got {rows.dtype}; use an integer dtype")
    fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[name]
    return functools.reduce(fn, rows.unbind(0))
