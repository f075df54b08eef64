"""What the rank functions of bench/checks/gpu_shared_suite.py share: a tally of checks,
fresh random data, gloo references over the ranks' CPU copies, comparisons that say
what differed.

Every check runs on every rank inside ``tally.check(name)``; a failing one records
``{"check": name, "differs": text}`` and the rank goes on, so one run reports every
failure. ``tally.result()`` is what a rank returns to ``run_world``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from commlab import CommlabUsageError

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DTYPES = (*FLOATS, torch.int32)
GLOO_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class Refused(Exception):
    """A call commlab refused (CommlabUsageError) that the docs do not promise: a skip."""


class Tally:
    """Checks counted, failures and skips recorded, progress printed on rank 0."""

    def __init__(self, rank: int, section: str):
        self.rank, self.section = rank, section
        self.checks = 0
        self.failures: list[dict] = []
        self.skips: list[dict] = []
        self.extra: dict = {}  # non-check results (latency), merged by the driver
        self._t0 = self._last = time.monotonic()

    @contextmanager
    def check(self, name: str, documented: bool = True):
        """One check: an exception or a failed comparison inside is its failure. A
        CommlabUsageError is a skip when ``documented`` is False (the docs do not
        promise that combination), a failure otherwise."""
        self.checks += 1
        try:
            yield
        except CommlabUsageError as e:
            if documented:
                self.fail(name, f"refused although documented as supported: {e}")
            else:
                self.checks -= 1
                self.skips.append({"check": name, "reason": f"refused: {e}"})
        except Exception as e:  # every other exception is this check's failure
            self.fail(name, f"{type(e).__name__}: {_short(str(e))}")
        self._progress()

    def fail(self, name: str, differs: str) -> None:
        self.failures.append({"check": name, "differs": f"rank {self.rank}: {differs}"})

    def skip(self, name: str, reason: str) -> None:
        self.skips.append({"check": name, "reason": reason})

    def _progress(self) -> None:
        now = time.monotonic()
        if self.rank == 0 and now - self._last > 10:
            self._last = now
            print(f"  [{self.section}] {self.checks} checks, {len(self.failures)} failed, "
                  f"{now - self._t0:.0f} s", flush=True)

    def result(self) -> dict:
        return {"checks": self.checks, "failures": self.failures, "skips": self.skips,
                "extra": self.extra}


def _short(text: str, limit: int = 600) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def random_tensor(gen: torch.Generator, shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Fresh values made on the CPU (the same on any device): normal floats, int32 in a
    range whose sums cannot overflow."""
    if dtype == torch.int32:
        x = torch.randint(-1000, 1000, shape, generator=gen, dtype=torch.int32)
    else:
        x = torch.randn(shape, generator=gen).to(dtype)
    return x.to(device)


def wide(x: torch.Tensor) -> torch.Tensor:
    """A CPU fp32 copy of a float tensor (exact), int32 stays int32."""
    x = x.detach().cpu()
    return x.to(torch.float32, copy=True) if x.dtype in FLOATS else x.clone()


def gloo_all_reduce(comm, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    ref = wide(x).contiguous()
    dist.all_reduce(ref, op=GLOO_OPS[op], group=comm.cpu_group)
    return ref


def gloo_all_gather(comm, x: torch.Tensor) -> torch.Tensor:
    w = wide(x).contiguous()
    parts = [torch.empty_like(w) for _ in range(comm.world_size)]
    dist.all_gather(parts, w, group=comm.cpu_group)
    return torch.cat(parts)


def gloo_broadcast(comm, x: torch.Tensor, src: int) -> torch.Tensor:
    ref = wide(x).contiguous()
    dist.broadcast(ref, src=src, group=comm.cpu_group)
    return ref


def gloo_all_to_all(comm, x: torch.Tensor) -> torch.Tensor:
    src = wide(x).contiguous()
    ref = torch.empty_like(src)
    dist.all_to_all_single(ref, src, group=comm.cpu_group)
    return ref


def assert_exact(out: torch.Tensor, ref: torch.Tensor) -> None:
    """``out`` equals the wide reference exactly, in the input's dtype and shape."""
    out = out.detach().cpu()
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    got = out.float() if out.dtype in FLOATS else out
    if not torch.equal(got, ref.to(got.dtype)):
        err = (got.double() - ref.double()).abs()
        i = int(err.flatten().argmax())
        raise AssertionError(f"max abs error {err.max().item():.4g} at flat index {i} "
                             f"(got {got.flatten()[i].item()}, gloo {ref.flatten()[i].item()}); "
                             f"expected exact")


def assert_sum(out: torch.Tensor, ref: torch.Tensor, abs_sum: torch.Tensor, world: int,
               roundings: int = 1) -> None:
    """A float sum within ``roundings`` roundings to its dtype of partial sums (commlab
    accumulates in fp32 and rounds at the end; a ring rounds each hop) plus fp32
    reordering: per element, (roundings*eps(dtype) + world*eps(fp32)) * sum|x_r|."""
    out = out.detach().cpu()
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    eps = torch.finfo(out.dtype).eps
    bound = (roundings * eps + world * torch.finfo(torch.float32).eps) * abs_sum + 1e-6
    err = (out.float() - ref).abs()
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=float(bound.max()) if
                               bound.numel() else 0.0)
    bad = err > bound
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{int(bad.sum())} of {out.numel()} elements off, max abs error "
                             f"{err.max().item():.4g}; first at flat index {i}: got "
                             f"{out.flatten()[i].item()}, gloo {ref.flatten()[i].item()}, "
                             f"bound {bound.flatten()[i].item():.3g}")


def assert_bf16_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16/fp16 GEMM output against an fp32 reference: a few ulps of the largest value
    (partial sums rounded to 16 bits differ from fp32 by ulps of the largest)."""
    out = out.detach().cpu()
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    ulp = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3}[out.dtype]
    scale = ulp * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(out.float(), ref, rtol=2 * ulp, atol=scale)


def sync(comm) -> None:
    if comm.backend == "cuda":
        torch.cuda.synchronize(comm.device)
