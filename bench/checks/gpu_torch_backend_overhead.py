"""The torch backend's per-call path on GPUs: results, Works, and its cost against a direct
commlab call of the same tensor (issue 29 item 3: at most 1.1x), ranks sharing the GPU(s).

    python bench/checks/gpu_torch_backend_overhead.py --ranks 2 --out $OUT/torch-backend-overhead-gpu-w2.json
    python bench/checks/gpu_torch_backend_overhead.py --ranks 1 --out $OUT/torch-backend-overhead-gpu-w1.json
    python bench/checks/gpu_torch_backend_overhead.py --backend cpu --ranks 2 --iters 5 --reps 3   # the harness, here

Each rank (rank r on GPU r % device_count) starts ``"cpu:gloo,cuda:commlab"``. Checks, one
PASS/FAIL line each: every op (all_reduce SUM/AVG, all_gather_into_tensor with a separate
output and with the input a slice of the output as FSDP passes it,
reduce_scatter_tensor SUM/AVG, broadcast, all_to_all_single) in fp32 and bf16 at odd sizes
against gloo on CPU copies; ``async_op=True`` Works (``wait()``, ``get_future()``'s value)
on a side stream. Then per-call time, eager: ``--reps`` interleaved rounds of ``--iters``
back-to-back calls each (synchronized at the end of a round), direct (``commlab:auto``)
against the backend (``torch-backend:commlab``), median round of the slowest rank; one
"ratio" line per op and size (PASS at most 1.1x). Records (shared/DESIGN.md's format)
go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SIZES = (8, 1 << 10, 64 << 10, 1 << 20)  # total bytes, fp32
GOAL = 1.1


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _checks(dev, world: int, rank: int, gloo) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) of every result and Work check."""
    out = []
    gen = torch.Generator().manual_seed(7 + rank)

    def ref(op, host, **kw):  # gloo on CPU copies
        h = host.clone()
        if op == "all_reduce":
            dist.all_reduce(h, op=kw.get("red", dist.ReduceOp.SUM), group=gloo)
            return h
        if op == "broadcast":
            dist.broadcast(h, src=kw["src"], group=gloo)
            return h
        if op == "all_gather":
            g = h.new_empty(h.numel() * world)
            dist.all_gather_into_tensor(g, h, group=gloo)
            return g
        if op == "all_to_all":
            g = torch.empty_like(h)
            dist.all_to_all_single(g, h, group=gloo)
            return g
        full = h.clone()  # reduce_scatter: gloo has no reduce_scatter_tensor
        dist.all_reduce(full, group=gloo)
        part = h.numel() // world
        y = full[rank * part:(rank + 1) * part]
        return y / world if kw.get("red") == dist.ReduceOp.AVG else y

    for dtype in (torch.float32, torch.bfloat16):
        tol = {"rtol": 1e-5, "atol": 1e-5 * world} if dtype == torch.float32 else \
            {"rtol": 2e-2, "atol": 2e-2 * world}
        for n in (1, 7, 1000, 4099):
            m = n * world  # split ops: whole pieces per rank
            for name, red in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
                host = torch.randn(n, generator=gen).to(dtype)
                t = host.to(dev, copy=True)
                dist.all_reduce(t, op=red)
                out.append(_close(f"all_reduce {name} {dtype} n={n}", t, ref("all_reduce", host,
                                                                         red=red), tol))
                host = torch.randn(m, generator=gen).to(dtype)
                o = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(o, host.to(dev, copy=True), op=red)
                out.append(_close(f"reduce_scatter_tensor {name} {dtype} n={m}", o,
                                  ref("reduce_scatter", host, red=red), tol))
            host = torch.randn(n, generator=gen).to(dtype)
            o = torch.empty(m, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(o, host.to(dev, copy=True))
            out.append(_close(f"all_gather_into_tensor {dtype} n={n}", o,
                              ref("all_gather", host), tol))
            o = torch.zeros(m, dtype=dtype, device=dev)  # FSDP: the input is our slice
            o[rank * n:(rank + 1) * n] = host.to(dev, copy=True)
            dist.all_gather_into_tensor(o, o[rank * n:(rank + 1) * n])
            out.append(_close(f"all_gather_into_tensor input-in-output {dtype} n={n}", o,
                              ref("all_gather", host), tol))
            t = host.to(dev, copy=True)
            dist.broadcast(t, src=world - 1)
            out.append(_close(f"broadcast {dtype} n={n}", t, ref("broadcast", host,
                                                                 src=world - 1), tol))
            host = torch.randn(m, generator=gen).to(dtype)
            o = torch.empty(m, dtype=dtype, device=dev)
            dist.all_to_all_single(o, host.to(dev, copy=True))
            out.append(_close(f"all_to_all_single {dtype} n={m}", o, ref("all_to_all", host),
                              tol))
    # async Works on a side stream: wait() orders the caller's stream after the kernels
    host = torch.randn(4099, generator=gen)
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    t = host.to(dev, copy=True)
    _sync(dev)
    with torch.cuda.stream(side) if side is not None else _nothing():
        work = dist.all_reduce(t, async_op=True)
    work.wait()
    fut = work.get_future().wait()
    want = ref("all_reduce", host)
    out.append(_close("async all_reduce: wait() then the tensor", t, want, {}))
    out.append(_close("async all_reduce: get_future() value", fut[0], want, {}))
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _close(name, got, want, tol) -> tuple[str, bool, str]:
    try:
        torch.testing.assert_close(got.cpu().float(), want.float(), **tol)
        return name, True, ""
    except AssertionError as e:
        return name, False, str(e).splitlines()[0]


def _timed(dev, world: int, rank: int, gloo, iters: int, reps: int) -> list[tuple]:
    """(op, bytes, direct us, backend us) per op and size, the slowest rank's."""
    import commlab

    rows = []
    for op in OPS:
        for nbytes in SIZES:
            n = max(1, nbytes // 4)
            n = n if op in ("all_reduce", "broadcast") else -(-n // world) * world
            x = torch.zeros(n // world if op == "all_gather" else n, device=dev)
            o = torch.empty(n if op == "all_gather" else
                            n // world if op == "reduce_scatter" else n, device=dev)
            direct = {"all_reduce": lambda: commlab.all_reduce(x),
                      "all_gather": lambda: commlab.all_gather(x),
                      "reduce_scatter": lambda: commlab.reduce_scatter(x),
                      "broadcast": lambda: commlab.broadcast(x, src=0),
                      "all_to_all": lambda: commlab.all_to_all(x)}[op]
            backend = {"all_reduce": lambda: dist.all_reduce(x),
                       "all_gather": lambda: dist.all_gather_into_tensor(o, x),
                       "reduce_scatter": lambda: dist.reduce_scatter_tensor(o, x),
                       "broadcast": lambda: dist.broadcast(x, src=0),
                       "all_to_all": lambda: dist.all_to_all_single(o, x)}[op]
            fns = {"direct": direct, "backend": backend}
            for fn in fns.values():
                for _ in range(10):
                    fn()
            times: dict[str, list[float]] = {k: [] for k in fns}
            for r in range(reps):
                for k in (("direct", "backend") if r % 2 == 0 else ("backend", "direct")):
                    _sync(dev)
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fns[k]()
                    _sync(dev)
                    times[k].append((time.perf_counter() - t0) / iters * 1e6)
            worst = torch.tensor([statistics.median(times["direct"]),
                                  statistics.median(times["backend"])], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
            rows.append((op, n * 4, float(worst[0]), float(worst[1])))
    return rows


def rank_main(comm, backend: str, iters: int, reps: int) -> dict:
    import warnings

    import commlab

    warnings.simplefilter("ignore", FutureWarning)  # torch's *_tensor deprecation notes
    if backend == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:commlab")
    else:
        dist.init_process_group("commlab")
    comm = commlab.init()
    world, rank, dev = dist.get_world_size(), dist.get_rank(), comm.device
    gloo = dist.new_group(backend="gloo")
    checks = _checks(dev, world, rank, gloo)
    comm.synchronize()
    rows = _timed(dev, world, rank, gloo, iters, reps)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return {"checks": checks, "rows": rows, "device": name}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="world size (ranks may share a GPU)")
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--iters", type=int, default=200, help="back-to-back calls per round")
    ap.add_argument("--reps", type=int, default=15, help="rounds per impl (interleaved)")
    ap.add_argument("--out", default="", help="JSON records file")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from commlab.bench._records import Record, git_commit
    from commlab.testing import run_world

    env = {"COMMLAB_BACKEND": a.backend, "OMP_NUM_THREADS": "1"}
    results = run_world(rank_main, a.ranks, args=(a.backend, a.iters, a.reps),
                        backend=a.backend, init=False, timeout=560, env=env)
    failed = 0
    for rank, res in enumerate(results):
        for name, ok, detail in res["checks"]:
            if not ok or rank == 0:
                print(f"{'PASS' if ok else 'FAIL'} rank {rank}: {name}" +
                      (f": {detail}" if detail else ""))
            failed += not ok
    commit, records = git_commit(ROOT), []
    for op, nbytes, d_us, b_us in results[0]["rows"]:
        ratio = b_us / d_us
        ok = ratio <= GOAL
        print(f"{'PASS' if ok else 'FAIL'} ratio {op} {nbytes} B: backend {b_us:.1f} us / "
              f"direct {d_us:.1f} us = {ratio:.2f} (goal <= {GOAL})")
        for impl, us in (("commlab:auto", d_us), ("torch-backend:commlab", b_us)):
            records.append(Record.measured(op=op, impl=impl, dtype="float32", nbytes=nbytes,
                                           world_size=a.ranks, time_us=us,
                                           device=results[0]["device"], commit=commit,
                                           mode="eager").__dict__)
    if a.out:
        Path(a.out).write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {a.out}")
    print(f"checks: {'all passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
