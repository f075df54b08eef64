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


def sparse_world(comm) -> dict:
    """A sparse all_reduce goes to the fallback (gloo's sparse path) and sums right."""
    rank, W, gloo = _start()
    i = torch.tensor([[rank, 3]])
    t = torch.sparse_coo_tensor(i, torch.tensor([1.0, float(rank)]), (5,))
    ref = t.clone()
    dist.all_reduce(t)
    dist.all_reduce(ref, group=gloo)
    from commlab.torch_backend import _group

    return {"got": t.to_dense().tolist(), "ref": ref.to_dense().tolist(),
            "routes": {f"{k[0]}:{k[1]}": v for k, v in _group.ROUTES.items()}}


def routes_world(comm) -> dict:
    """all_reduce's ways in (blocking, ``async_op=True``, the group's method without
    options): each sums as gloo does and counts once as a kernel call."""
    rank, W, gloo = _start()
    from commlab.torch_backend import _group

    x = torch.arange(7.0) * (rank + 1)
    ref = x.clone()
    dist.all_reduce(ref, group=gloo)
    _group.ROUTES.clear()
    a, b, c = x.clone(), x.clone(), x.clone()
    dist.all_reduce(a)
    work = dist.all_reduce(b, async_op=True)
    done = work.wait()
    fut = work.get_future().wait()
    dist.group.WORLD.allreduce([c]).wait()  # type: ignore[union-attr]
    return {"ref": ref.tolist(), "got": [a.tolist(), b.tolist(), fut[0].tolist(), c.tolist()],
            "done": done, "routes": {f"{k[0]}:{k[1]}": v for k, v in _group.ROUTES.items()}}


def _timed(fn) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        fn()
        return "", time.monotonic() - t0
    except Exception as e:  # noqa: BLE001  (the test reads the type and message)
        return f"{type(e).__name__}: {e}", time.monotonic() - t0


def missing_rank_world(comm) -> dict:
    """A group made with timeout=2 s whose collective rank 1 skips: before the Communicator
    exists (the lazy build) and after; both times rank 0 raises after the group's timeout,
    naming rank 1 (after the build's timeout the world goes on)."""
    rank, W, gloo = _start()
    g = dist.new_group(timeout=timedelta(seconds=2))
    out = {}
    if rank == 0:
        out["build"] = _timed(lambda: dist.barrier(group=g))
    dist.barrier(group=gloo)
    t = torch.ones(4)
    dist.all_reduce(t, group=g)  # everyone: builds now
    out["after_build"] = t.tolist()
    if rank == 0:  # a repeated call runs ahead: its kernel's wait names the absent rank
        out["agreement"] = _timed(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier(group=gloo)  # (a world after a timed-out kernel needs comm.recover())
    return out


def dead_rank_world(comm) -> dict:
    """Rank 1 is killed after the Communicator is built; rank 0's next dist.all_reduce
    must name it (the default group's timeout is torch's default: COMMLAB_TIMEOUT rules)."""
    import os
    import signal

    rank, W, gloo = _start()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    dist.all_reduce(t)  # raises RankLostError: rank 1 was lost
    return {}


def monitored_barrier_world(comm) -> dict:
    """What README says: dist.monitored_barrier() on the "commlab" group raises torch's
    ValueError; the group's own method (what torch calls) and a gloo group both work,
    and a rank that skips it is named."""
    rank, W, gloo = _start()
    out = {"public": _timed(lambda: dist.monitored_barrier(timeout=timedelta(seconds=5)))[0]}
    dist.group.WORLD.monitored_barrier(timedelta(seconds=5), wait_all_ranks=True)
    dist.monitored_barrier(group=gloo, timeout=timedelta(seconds=5))
    if rank == 0:
        out["skipped"] = _timed(
            lambda: dist.group.WORLD.monitored_barrier(timedelta(seconds=2)))[0]
    elif rank != 1:
        _timed(lambda: dist.group.WORLD.monitored_barrier(timedelta(seconds=2)))
    dist.barrier(group=gloo)
    return out


def profiler_world(comm) -> dict:
    """Each collective's ``commlab:<op>`` events under torch.profiler: the same checks
    torch's suite makes of gloo's (one event per call, async, the input shapes)."""
    rank, W, gloo = _start()
    x = torch.ones(3, 4)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_gather": lambda: dist.all_gather([torch.empty(3, 4) for _ in range(W)], x),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(W * 3, 4), x),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(3, 4), torch.ones(W * 3, 4)),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty(W * 3, 4),
                                                     torch.ones(W * 3, 4)),
        "barrier": lambda: dist.barrier(),
        "gather": lambda: dist.gather(x, [torch.empty(3, 4) for _ in range(W)]
                                      if rank == 0 else None, dst=0),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([x, torch.ones(2)]),
    }
    dist.all_reduce(torch.ones(1))  # built before profiling
    out = {}
    for name, call in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            call()
        event = "all_reduce" if name == "all_reduce_coalesced" else name
        evs = [e for e in prof.events() if e.name == f"commlab:{event}"]
        out[name] = [(e.is_async, e.count, [list(s) for s in e.input_shapes]) for e in evs]
    return out
