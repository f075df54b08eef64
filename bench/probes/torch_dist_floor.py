"""The floor torch itself puts under ``dist.all_reduce``: a backend that does nothing.

Issue 29 item 3 asks ``dist.all_reduce`` on "commlab" to cost at most 1.1x a direct
``commlab.all_reduce``. This times, per call, a world of one and an 8-byte tensor, two
backends that move nothing, so what remains is torch's own layers:

- ``fake``: torch's C++ ``FakeProcessGroup`` (``dist.init_process_group("fake")``, as
  torch's tests start it): the Python wrapper, pybind into the C++ ``ProcessGroup``, the
  dispatcher's ``c10d::allreduce_``, the backend, a C++ ``FakeWork``, ``wait()``.
- ``python``: a ``dist.ProcessGroup`` subclass registered with
  ``dist.Backend.register_backend`` (the only way a Python backend plugs in: c10d's
  ``Backend`` has no Python constructor) whose ``allreduce`` returns one shared
  completed Work. ``dist.all_reduce`` finds the Python method directly; C++ callers
  (DDP's reducer, functional collectives) come through pybind's trampoline, timed as
  ``ProcessGroup.allreduce(pg, ...)`` (the C++ method on the Python object).

Pieces of each: ``pg.allreduce([t], opts)`` alone, ``work.wait()`` alone, the cost of
each completed Work torch offers (made per call), and, with ``--commlab``, the
"commlab" backend's same rows beside a direct ``commlab.all_reduce``, and again with
the backend's runner (``_into.all_reduce_``) replaced by a no-op: the backend's own
Python between torch and commlab's dispatch. Rows are the
median of ``--reps`` runs of ``--iters`` calls (after warm-up), an empty call
subtracted from none of them; on CUDA the tensor is on the GPU and each run ends with
``torch.cuda.synchronize()``.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 python bench/probes/torch_dist_floor.py \
        --device cpu --commlab --out bench/results/torch-dist-floor-cpu.json

The answer (8 B, world of one): torch alone costs more than issue 29's budget of 0.1x a
~6 us direct call. On the shared 2-core box (torch 2.13, CPU tensor) ``dist.all_reduce``
takes 2.1 us on the do-nothing Python group and 4.0 us on ``FakeProcessGroup``; on one
H100 host (torch 2.11, CUDA tensor, ``bench/results/h100-torch-dist-floor.json``) 2.4 and
8.1 us against a direct ``commlab.all_reduce`` of 6.05. A completed Work costs 0.07 us
shared, 0.4-0.7 made per call (a ``dist.Work`` subclass, ``FakeWork``), 2.5-6.7 from a
Future. So 1.1x is out of reach for any backend behind ``dist.*``, a C++ one included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

ROOT = Path(__file__).resolve().parents[2]
NOOP = "noop"  # the registered name of the do-nothing Python backend


def per_call_us(fn, dev: torch.device, iters: int, reps: int) -> float:
    """Median over ``reps`` runs of ``iters`` calls of ``fn`` (warmed up), in µs."""
    for _ in range(min(iters, 2000)):
        fn()
    _sync(dev)
    runs, rng = [], range(iters)
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in rng:
            fn()
        _sync(dev)
        runs.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(runs)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class _Finished(dist.Work):
    """A Python Work that is done: ``wait()`` returns True (``test_c10d_pypg``'s shape)."""

    def wait(self, timeout=None) -> bool:
        return True


_SHARED = _Finished()


class NoopGroup(dist.ProcessGroup):
    """A Python backend whose ``allreduce`` does nothing and returns one shared Work."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch stubs lack it (2.13)

    def getBackendName(self) -> str:
        return NOOP

    def allreduce(self, tensors, opts=None):
        return _SHARED


def _start(backend: str) -> dist.ProcessGroup:
    """``backend`` as the default group of a world of one."""
    if backend == "fake":
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    return dist.group.WORLD  # type: ignore[return-value]


def _blocking() -> c10d.AllreduceOptions:
    """The options ``dist.all_reduce(t)`` passes (SUM, ``asyncOp`` False)."""
    opts = c10d.AllreduceOptions()
    opts.asyncOp = False
    return opts


def _rows_for(backend: str, t: torch.Tensor, dev, iters: int, reps: int) -> dict:
    pg = _start(backend)
    opts = _blocking()
    work = pg.allreduce([t], opts)
    cxx = c10d.ProcessGroup.allreduce  # the C++ method, reaching Python through pybind

    def timed(fn):
        return per_call_us(fn, dev, iters, reps)

    rows = {
        "dist.all_reduce(t)": timed(lambda: dist.all_reduce(t)),
        "pg.allreduce([t], opts)": timed(lambda: pg.allreduce([t], opts)),
        "pg.allreduce([t], opts).wait()": timed(lambda: pg.allreduce([t], opts).wait()),
        "work.wait()": timed(work.wait),
    }
    if backend == NOOP:
        rows["ProcessGroup.allreduce(pg, [t], opts) (C++ -> trampoline)"] = timed(
            lambda: cxx(pg, [t], opts))
    dist.destroy_process_group()
    return rows


def _work_rows(dev, iters: int, reps: int) -> dict:
    """What each completed Work torch offers costs to make (and wait on) per call."""
    from torch.futures import Future

    def from_future():
        fut = Future(devices=[dev]) if dev.type == "cuda" else Future()
        fut.set_result([])
        return c10d._create_work_from_future(fut)

    makers = {"shared Python Work (no new object)": lambda: _SHARED,
              "c10d.FakeWork()": c10d.FakeWork,
              "dist.Work subclass()": _Finished,
              "_create_work_from_future(done Future)": from_future}
    return {f"make + wait: {k}": per_call_us(lambda m=m: m().wait(), dev, iters, reps)
            for k, m in makers.items()}


def _commlab_rows(t: torch.Tensor, dev, iters: int, reps: int) -> dict:
    """The "commlab" backend beside a direct ``commlab.all_reduce``, a world of one."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", "29631")
    sys.path.insert(0, str(ROOT))
    import commlab
    from commlab.torch_backend import _into

    dist.init_process_group("cpu:gloo,cuda:commlab" if dev.type == "cuda" else "commlab")
    commlab.init()
    from commlab.torch_backend import CommlabProcessGroup

    pg = dist.group.WORLD  # "cpu:gloo,cuda:commlab": torch keeps the Python group itself
    be: Any = pg if isinstance(pg, CommlabProcessGroup) else pg._get_backend(dev)  # type: ignore[union-attr]
    opts = _blocking()
    noop = dist.new_group(backend=NOOP)
    dist.all_reduce(t)
    commlab.all_reduce(t)

    def timed(fn, n=max(iters // 10, 200)):  # a whole call: a tenth of the calls
        return per_call_us(fn, dev, n, reps)

    rows = {
        "commlab.all_reduce(t) (direct)": timed(lambda: commlab.all_reduce(t)),
        "_into.all_reduce_(t) (the backend's runner)":
            timed(lambda: _into.all_reduce_(t, "sum", "auto")),
        "dist.all_reduce(t)": timed(lambda: dist.all_reduce(t)),
        "backend.allreduce([t], opts)": timed(lambda: be.allreduce([t], opts)),
        # the noop backend's floor beside real work (layers run colder than alone)
        "direct + dist.all_reduce(t, group=noop)": timed(
            lambda: (commlab.all_reduce(t), dist.all_reduce(t, group=noop))),
    }
    real = _into.all_reduce_
    _into.all_reduce_ = lambda x, op, algorithm: x  # left: torch's layers and the backend's
    try:
        rows["dist.all_reduce(t), the runner a no-op"] = timed(lambda: dist.all_reduce(t), iters)
        rows["backend.allreduce([t], opts), the runner a no-op"] = timed(
            lambda: be.allreduce([t], opts), iters)
    finally:
        _into.all_reduce_ = real
    dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--iters", type=int, default=20000, help="calls per run")
    ap.add_argument("--reps", type=int, default=7, help="runs per row (median)")
    ap.add_argument("--commlab", action="store_true",
                    help="also time the commlab backend and the direct call")
    ap.add_argument("--out", default="", help="JSON file for the rows")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cuda":  # with its index: a Future's devices must name one
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    t = torch.zeros(2, device=dev)  # 8 bytes
    dist.Backend.register_backend(NOOP, lambda store, rank, size, timeout: NoopGroup(rank, size),
                                  devices=["cpu", "cuda"])
    tables = {"fake (C++ FakeProcessGroup)": _rows_for("fake", t, dev, a.iters, a.reps),
              "noop (Python ProcessGroup, shared Work)": _rows_for(NOOP, t, dev, a.iters,
                                                                   a.reps),
              "completed Works": _work_rows(dev, a.iters, a.reps)}
    if a.commlab:
        tables["commlab (world of one)"] = _commlab_rows(t, dev, a.iters, a.reps)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else \
        f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    print(f"# torch {torch.__version__}, {name}, 8-byte float32, world 1, "
          f"median of {a.reps} runs (us per call)")
    for title, rows in tables.items():
        print(f"\n{title}")
        for k, v in rows.items():
            print(f"  {k:<62} {v:8.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps({"commit": os.environ.get("COMMLAB_COMMIT", ""),
                                           "torch": torch.__version__, "device": name,
                                           "iters": a.iters, "reps": a.reps,
                                           "us_per_call": tables}, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
