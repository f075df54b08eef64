"""Host cost of torch.distributed on the "commlab" backend, and a DDP step, against
calling commlab directly and against gloo (CPU) or NCCL (CUDA).

    .venv/bin/python bench/torch_backend_bench.py --world 2            # CPU, spawns ranks
    python bench/torch_backend_bench.py --device cuda --world 2         # 2 GPUs

Per call: back-to-back calls of a small all_reduce (the host's cost dominates), median of
``--reps`` windows of ``--iters`` calls, the slowest rank's; ``dist:commlab-layer`` is
the backend's own share (the call minus its time inside commlab.all_reduce). DDP: a 3-layer MLP's step
(forward, backward with bucket all-reduces, SGD), median over ``--steps`` steps. Every
impl is checked against the reference group before it is timed. Records have the
fields of commlab.bench's records (``impl``: ``dist:commlab``, ``commlab:auto``, ``gloo``/``nccl``; the DDP step
is ``op="ddp_step"`` with the gradient bytes); the table goes to stdout.
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

ROOT = Path(__file__).resolve().parents[1]
SIZES = (8, 4096, 65536)  # bytes of float32


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_call_us(fn, device, gloo, iters: int, reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / iters * 1e6)
    worst = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
    return float(worst)


def _mlp(seed: int, width: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width))


def _ddp_step_us(group, device, gloo, width: int, steps: int) -> tuple[float, list[float]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(0, width).to(device), process_group=group, bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(32, width, generator=g).to(device)
    times, losses = [], []
    for _ in range(steps + 3):
        _sync(device)
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e6)
        losses.append(loss.item())
    worst = torch.tensor([statistics.median(times[3:])], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
    return float(worst), losses


def _layer_cost(device, name, commit, W, calls: int) -> list:
    """The backend's own host time per dist.all_reduce: the call's time minus the time
    inside commlab's all-reduce (timed around it in the same calls; the median of each):
    ``_native.all_reduce``, or on CPU the in-place ``_into.all_reduce_``."""
    from commlab.bench._records import Record
    from commlab.torch_backend import _into, _native

    inner_fns, inside = (_native.all_reduce, _into.all_reduce_), []

    def timed(inner_fn):
        def timed_inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return inner_fn(*a, **k)
            finally:
                inside.append(time.perf_counter() - t0)

        return timed_inner

    out = []
    for nbytes in SIZES:
        x = torch.zeros(nbytes // 4, device=device)
        _native.all_reduce, _into.all_reduce_ = map(timed, inner_fns)
        try:
            layer = []
            for _ in range(calls):
                _sync(device)
                t0 = time.perf_counter()
                dist.all_reduce(x)
                total = time.perf_counter() - t0
                layer.append((total - inside[-1]) * 1e6)
        finally:
            _native.all_reduce, _into.all_reduce_ = inner_fns
        out.append(Record.measured(op="all_reduce", impl="dist:commlab-layer", dtype="float32",
                                   nbytes=nbytes, world_size=W,
                                   time_us=statistics.median(layer), device=name,
                                   commit=commit, mode="eager"))
    return out


def bench(comm, device_type: str, iters: int, reps: int, steps: int, width: int) -> list:
    import commlab
    from commlab.bench._records import Record, git_commit

    if device_type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("cpu:gloo,cuda:commlab")  # no device_id: README here
        ref_name = "nccl"
        ref = dist.new_group(backend="nccl")
        device = torch.device("cuda", local)
    else:
        dist.init_process_group("commlab")
        ref_name = "gloo"
        device = torch.device("cpu")
    gloo = dist.new_group(backend="gloo")
    ref = gloo if device_type == "cpu" else ref
    c = commlab.init()
    W, rank = dist.get_world_size(), dist.get_rank()
    name = torch.cuda.get_device_name(device) if device_type == "cuda" else \
        f"cpu ({os.cpu_count()} cores)"
    commit = git_commit(ROOT)
    records = []
    for nbytes in SIZES:
        x = torch.full((nbytes // 4,), float(rank + 1), device=device)
        want = torch.full_like(x, W * (W + 1) / 2)
        timed = torch.zeros_like(x)  # reduced in place call after call: stays finite
        impls = {
            "dist:commlab": lambda: dist.all_reduce(timed),
            "commlab:auto": lambda: commlab.all_reduce(timed),
            ref_name: lambda: dist.all_reduce(timed, group=ref),
        }
        for impl, fn in impls.items():  # verify on fresh copies, then time
            y = x.clone()
            got = commlab.all_reduce(y) if impl == "commlab:auto" else y
            if impl == "dist:commlab":
                dist.all_reduce(y)
            elif impl == ref_name:
                dist.all_reduce(y, group=ref)
            if not torch.equal(got, want):
                raise RuntimeError(f"{impl} all_reduce {nbytes} B: wrong result")
            us = _per_call_us(fn, device, gloo, iters, reps)
            records.append(Record.measured(op="all_reduce", impl=impl, dtype="float32",
                                           nbytes=nbytes, world_size=W, time_us=us,
                                           device=name, commit=commit, mode="eager"))
    records += _layer_cost(device, name, commit, W, iters * reps)
    losses = {}
    grad_bytes = sum(p.numel() * 4 for p in _mlp(0, width).parameters())
    for impl, group in (("dist:commlab", dist.group.WORLD), (ref_name, ref)):
        us, losses[impl] = _ddp_step_us(group, device, gloo, width, steps)
        r = Record.measured(op="all_reduce", impl=impl, dtype="float32", nbytes=grad_bytes,
                            world_size=W, time_us=us, device=name, commit=commit,
                            mode="eager")  # busbw as for the step's gradient all-reduce
        r.op = "ddp_step"
        records.append(r)
    torch.testing.assert_close(losses["dist:commlab"], losses[ref_name], rtol=1e-4, atol=1e-5)
    del c
    dist.destroy_process_group()
    return [r.__dict__ for r in records] if rank == 0 else []


def _table(records: list[dict]) -> str:
    lines = [f"{'op':<11}{'bytes':>8}  {'impl':<14}{'us':>10}"]
    for r in records:
        lines.append(f"{r['op']:<11}{r['bytes']:>8}  {r['impl']:<14}{r['time_us']:>10.1f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (CPU, no torchrun)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--out", default=None, help="records file (JSON list)")
    a = p.parse_args()
    args = (a.device, a.iters, a.reps, a.steps, a.width)
    if "RANK" in os.environ:  # under torchrun: this process is one rank
        records = bench(None, *args)
        if int(os.environ["RANK"]) != 0:
            return
    else:
        sys.path.insert(0, str(ROOT))
        from commlab.testing import run_world

        env = {"COMMLAB_BACKEND": "cpu"} if a.device == "cpu" else {}
        records = run_world(bench, a.world, args=args, init=False, timeout=1200, env=env)[0]
    print(_table(records))
    out = a.out or ROOT / "bench" / "results" / (
        f"torch-backend-{a.device}-w{records[0]['world_size']}.json")
    Path(out).write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
