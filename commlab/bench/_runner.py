"""The benchmark loop: for every op, size and implementation, verify, then time.

Collective: every rank calls ``run`` with the same arguments. Each implementation's
output is checked against the reference (NCCL on GPU, gloo on CPU) on fresh random data
before it is timed; an implementation that is wrong on any rank is reported on every
rank and not timed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist

import commlab
from commlab.bench import _timing
from commlab.bench._impls import DTYPES, Impl, implementations, make_input, reference
from commlab.bench._records import OPS, Record, device_name, fmt_bytes, git_commit

T = TypeVar("T")


@dataclass
class Failure:
    op: str
    impl: str
    nbytes: int
    mode: str
    message: str

    def __str__(self) -> str:
        return f"{self.op} {self.impl} {fmt_bytes(self.nbytes)} {self.mode}: {self.message}"


@dataclass
class BenchResult:
    records: list[Record] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)  # wrong results (not timed)
    skipped: list[str] = field(default_factory=list)  # could not run here, and why


def reps_for(nbytes: int, iters: int) -> int:
    """``iters`` repetitions up to 16 MiB, proportionally fewer above (at least 5, or
    ``iters`` if that is fewer)."""
    return max(min(5, iters), min(iters, iters * (16 << 20) // max(1, nbytes)))


def inner_for(nbytes: int) -> int:
    """Back-to-back eager launches per timed repetition: 10 for small messages, 1 for big."""
    return max(1, min(10, (4 << 20) // max(1, nbytes)))


def tolerance(dtype: torch.dtype, world: int) -> dict:
    """assert_close tolerances: the reference may sum in another order or in low precision."""
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2 * world}
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5 * world}
    return {"rtol": 0, "atol": 0}


def check(out, ref: torch.Tensor, world: int) -> str:
    """"" if ``out`` matches ``ref``, else what differs."""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    out = out.reshape(-1)
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return (f"shape/dtype {tuple(out.shape)} {out.dtype}, "
                f"expected {tuple(ref.shape)} {ref.dtype}")
    try:
        torch.testing.assert_close(out, ref, **tolerance(ref.dtype, world))
    except AssertionError as e:
        return " ".join(str(e).split("\n")[1:3]).strip() or "values differ from the reference"
    return ""


def _agree(comm, local_error: str) -> str:
    """Every rank's verdict on every rank: "" only if all ranks passed."""
    flag = torch.tensor([0 if local_error else 1], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=comm.cpu_group)
    if flag.item():
        return ""
    errors = [None] * comm.world_size
    dist.all_gather_object(errors, local_error, group=comm.cpu_group)
    return "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e)


def select(impls: list[Impl], patterns) -> list[Impl]:
    """Keep impls whose name (``commlab:ring``) or short name (``ring``) matches a pattern
    (fnmatch, e.g. ``commlab:*``, ``nccl``, ``two_shot``)."""
    if not patterns:
        return impls
    short = lambda name: name.split(":", 1)[-1]  # noqa: E731
    return [i for i in impls if any(fnmatch.fnmatch(i.name, p) or fnmatch.fnmatch(short(i.name), p)
                                    for p in patterns)]


def _attempt(fn: Callable[[], T]) -> tuple[T | None, str]:
    """(fn(), "") or (None, what it raised)."""
    try:
        return fn(), ""
    except Exception as e:  # reported on every rank by _agree, then skipped
        return None, f"{type(e).__name__}: {e}".strip()[:400]


def run(comm=None, *, ops=OPS, sizes=(8, 1 << 20), dtype: str | None = None,
        algorithms=None, modes=("eager",), iters: int = 20, progress: bool = True,
        extra_impls: tuple = (), seed: int = 0) -> BenchResult:
    """Verify and time every implementation of ``ops`` at ``sizes`` (bytes); collective."""
    comm = comm or commlab.get_communicator()
    dtype = dtype or ("bfloat16" if comm.backend == "cuda" else "float32")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ValueError(f"unknown op(s) {bad}; use some of {', '.join(OPS)}")
    torch_dtype = DTYPES[dtype]
    result = BenchResult()
    if "graph" in modes and comm.backend != "cuda":
        result.skipped.append("graph mode: CUDA graphs need the cuda backend (timed eager only)")
        modes = tuple(m for m in modes if m != "graph")
    plan = []
    for op in ops:
        impls = [i for i in implementations(op, comm.backend) + list(extra_impls)
                 if i.op == op and comm.backend in i.backends]
        impls = select(impls, algorithms)
        plan += [(op, s, impls) for s in sizes]
    bar = None
    if progress and comm.rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(i) for _, _, i in plan), desc="commbench", unit="impl")
    meta = {"world_size": comm.world_size, "device": device_name(comm),
            "commit": _shared_commit(comm), "dtype": dtype}
    for op, nbytes, impls in plan:
        x, total = make_input(op, nbytes, torch_dtype, comm, seed)
        ref = reference(op, comm, x)
        for impl in impls:
            if bar is not None:
                bar.set_postfix_str(f"{op} {fmt_bytes(total)} {impl.name}")
            _measure(comm, impl, x, ref, total, modes, iters, meta, result)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return result


def _shared_commit(comm) -> str:
    got = [git_commit() if comm.rank == 0 else None]
    dist.broadcast_object_list(got, src=0, group=comm.cpu_group)
    commit = got[0]
    assert commit is not None  # rank 0 sent its commit to every rank
    return commit


def _measure(comm, impl: Impl, x, ref, total: int, modes, iters, meta, result) -> None:
    world = comm.world_size
    prepared, err = _attempt(lambda: impl.prepare(comm, x))
    raised = bool(err)
    if not err:
        assert prepared is not None  # _attempt returns fn()'s value when nothing raised
        out, err = _attempt(prepared.call)
        raised = bool(err)
        err = err or check(out, ref, world)
    raised = _agree(comm, "raised" if raised else "") != ""
    err = _agree(comm, err)
    if err and impl.optional:  # PyTorch lacks the op here, or it gave a wrong result:
        what = "" if raised else "wrong result, not timed: "  # never timed, never fatal
        result.skipped.append(f"{impl.name} {impl.op} {fmt_bytes(total)}: {what}{err}")
        return
    if err:
        result.failures.append(Failure(impl.op, impl.name, total, "eager", err))
        return
    for mode in modes:
        if mode not in impl.modes:
            result.skipped.append(f"{impl.name} {impl.op}: no {mode} mode")
            continue
        time_us, err = _time_mode(comm, prepared, mode, total, iters, ref)
        err = _agree(comm, err)
        if err and impl.optional and "capture failed" in err:  # PyTorch op not capturable
            result.skipped.append(f"{impl.name} {impl.op} {fmt_bytes(total)} {mode}: {err}")
            continue
        if err:
            result.failures.append(Failure(impl.op, impl.name, total, mode, err))
            continue
        result.records.append(Record.measured(
            op=impl.op, impl=impl.name, dtype=meta["dtype"], nbytes=total,
            world_size=world, time_us=time_us, device=meta["device"], commit=meta["commit"],
            mode=mode))


def _time_mode(comm, prepared, mode: str, total: int, iters: int, ref) -> tuple[float, str]:
    reps = reps_for(total, iters)
    if comm.backend != "cuda":
        return _timed(lambda: _timing.time_host(comm, prepared.call, reps=reps))
    if mode == "eager":
        return _timed(lambda: _timing.time_eager(comm, prepared.call, reps=reps,
                                                   inner=inner_for(total)))
    # graph: capture, check one replay's output, then time replays
    calls = _timing.graph_calls(max(total, ref.numel() * ref.element_size()))
    if prepared.reset:
        prepared.reset()
    captured, err = _attempt(lambda: _timing.capture(comm, prepared.call, calls))
    if err or captured is None:
        return 0.0, f"capture failed: {err}"
    graph, out = captured
    if prepared.reset and calls == 1:  # the single replayed call must see fresh input
        prepared.reset()
    if prepared.reset is None or calls == 1:
        graph.replay()
        comm.synchronize()
        bad = check(out, ref, comm.world_size)
        if bad:
            return 0.0, f"graph replay differs: {bad}"
    return _timed(lambda: _timing.time_graph(comm, graph, calls, reps=reps))


def _timed(fn: Callable[[], float]) -> tuple[float, str]:
    """(µs, "") or (0.0, what it raised): the time counts only when nothing raised."""
    t, err = _attempt(fn)
    return (0.0 if t is None else t), err
