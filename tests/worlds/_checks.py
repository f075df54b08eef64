"""Helpers shared by the rank functions: a failure collector and reference comparisons.

Rank functions run many checks in one world (a world costs seconds to start). Each check
runs inside ``checks.case(section, label)``; a failing check is recorded with its label
and traceback and the world goes on, so one run reports every failure. The test then
asserts on its own section.
"""

from __future__ import annotations

import traceback
from collections import Counter
from contextlib import contextmanager

import torch
import torch.distributed as dist

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DTYPES = (*FLOATS, torch.int32)
GLOO_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class Checks:
    def __init__(self, rank: int):
        self.rank = rank
        self.ran: Counter = Counter()
        self.failures: dict[str, list[str]] = {}

    @contextmanager
    def case(self, section: str, label: str):
        self.ran[section] += 1
        try:
            yield
        except Exception:
            text = traceback.format_exc(limit=-3)
            self.failures.setdefault(section, []).append(f"rank {self.rank} {label}:\n{text}")

    def result(self) -> dict:
        return {"ran": dict(self.ran), "failures": self.failures}


def random_tensor(gen: torch.Generator, shape, dtype: torch.dtype) -> torch.Tensor:
    """Fresh random values: normal floats, int32 in a range whose sums cannot overflow."""
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, shape, generator=gen, dtype=torch.int32)
    return torch.randn(shape, generator=gen).to(dtype)


def wide(x: torch.Tensor) -> torch.Tensor:
    """fp32 copy of a float tensor (exact), int32 stays int32."""
    return x.to(torch.float32, copy=True) if x.dtype in FLOATS else x.clone()


def gloo_all_reduce(x: torch.Tensor, op: str) -> torch.Tensor:
    ref = wide(x).contiguous()
    dist.all_reduce(ref, op=GLOO_OPS[op])
    return ref


def gloo_all_gather(x: torch.Tensor) -> list[torch.Tensor]:
    w = wide(x).contiguous()
    parts = [torch.empty_like(w) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, w)
    return parts


def assert_reduced(out: torch.Tensor, x: torch.Tensor, ref: torch.Tensor, op: str,
                   roundings: int = 1, abs_sum: torch.Tensor | None = None) -> None:
    """``out`` is the reduction of every rank's ``x`` whose exact-ish value is ``ref``
    (gloo's fp32 result). Integers and max/min must match exactly. A float sum may
    differ from ``ref`` by ``roundings`` roundings to ``x.dtype`` of partial sums (each at
    most eps·Σ|x_r|) plus fp32 reordering. ``abs_sum`` is Σ|x_r| (gloo computes it from
    ``x`` when not given)."""
    assert out.dtype == x.dtype, f"dtype {out.dtype} != {x.dtype}"
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if x.dtype == torch.int32 or op != "sum":
        torch.testing.assert_close(out, ref.to(x.dtype), rtol=0, atol=0)
        return
    if abs_sum is None:
        abs_sum = gloo_all_reduce(x.abs(), "sum") if x.numel() else ref
    world = dist.get_world_size()
    bound = (roundings * torch.finfo(x.dtype).eps + world * torch.finfo(torch.float32).eps) \
        * abs_sum + 1e-6
    err = (out.float() - ref).abs()
    bad = err > bound
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{int(bad.sum())} of {out.numel()} elements off; first at flat index {i}: "
            f"got {out.flatten()[i].item()}, gloo {ref.flatten()[i].item()}, "
            f"bound {bound.flatten()[i].item():.3g}"
        )


def assert_unchanged(x: torch.Tensor, before: torch.Tensor, what: str) -> None:
    assert torch.equal(x, before), f"{what} modified its input"


def assert_new_tensor(out: torch.Tensor, x: torch.Tensor, what: str) -> None:
    if out.numel() and x.numel():
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), \
            f"{what} returned a tensor sharing the input's storage"


def same_on_every_rank(t: torch.Tensor) -> bool:
    """Whether ``t`` is bitwise identical on every rank (compared as raw bytes)."""
    raw = t.reshape(-1).contiguous().view(torch.uint8)
    parts = [torch.empty_like(raw.int()) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, raw.int())
    return all(torch.equal(p, parts[0]) for p in parts)


def same_error_everywhere(msg: str, rank: int, world: int, where: str = "") -> None:
    """Every rank raised an error (``msg`` non-empty) and all raised the same text."""
    assert msg, f"rank {rank}: no RankMismatchError{f' by the {where}' if where else ''}"
    every = [None] * world
    dist.all_gather_object(every, msg)
    assert len(set(every)) == 1, f"the ranks raised different texts: {every}"
