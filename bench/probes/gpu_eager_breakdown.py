"""Where an eager call's host microseconds go: each step of the launch plan timed alone.

One GPU, a world of one (issue 29). Every row is host time per call (perf_counter over
``--iters`` calls, median of ``--reps`` runs, minus the cost of calling an empty lambda):
torch attribute reads the plan makes, each step of ``_plan.fast_call`` alone, the whole
path at each layer (``fast_call``, ``_host.run``, ``commlab.all_reduce``), a minimal
Python path on the same plan (the floor of a Python redesign), and torch's symm-mem
one_shot and NCCL all_reduce of the same tensor. With the C twin on, the whole call
again with its entry on Triton's launcher instead of commlab's own cuLaunchKernel.

    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 \
        python bench/probes/gpu_eager_breakdown.py --out /tmp/breakdown.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import commlab  # noqa: E402
from commlab.collectives import _across, _adapt, _launcher, _rawlaunch  # noqa: E402
from commlab.collectives._host import run  # noqa: E402
from commlab.collectives._plan import fast_call  # noqa: E402
from commlab.collectives.all_reduce import ALL_REDUCE  # noqa: E402
from commlab.runtime import _native  # noqa: E402
from commlab.runtime.communicator import get_communicator  # noqa: E402
from commlab.trace import needed  # noqa: E402


def per_call_ns(fn, iters: int, reps: int) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    runs = []
    rng = range(iters)
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in rng:
            fn()
        runs.append((time.perf_counter_ns() - t0) / iters)
        torch.cuda.synchronize()
    return statistics.median(runs)


def toolchain() -> dict:
    """What the C fast path is built with here (``runtime._native``'s choice)."""
    inc = sysconfig.get_paths()["include"]
    cc = _native._compiler()
    ver = ""
    if cc:
        ver = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {"cc": cc, "cc_version": ver, "python_h": os.path.exists(os.path.join(inc, "Python.h")),
            "include": inc}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--bytes", type=int, default=8192)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    comm = commlab.init(backend="cuda")
    x = torch.ones(a.bytes // 2, dtype=torch.bfloat16, device=comm.device)
    commlab.all_reduce(x)
    commlab.all_reduce(x)
    key = ("all_reduce", x.shape, x.dtype, x.device, "sum", "auto")
    plan = next(p for k, p in comm.plans.items() if k[:3] == key[:3])
    key = next(k for k in comm.plans if k[:3] == key[:3])
    s = _launcher.raw_stream(0)
    out = plan.outputs.take(x, s, False)
    xp, op = x.data_ptr(), out.data_ptr()
    ints, fire, rec, control = plan.ints, plan.fire, plan.record, comm.control
    cap = torch._C._cuda_isCurrentStreamCapturing
    lock = threading.Lock()
    group = dist.group.WORLD.group_name
    t = None
    try:
        import torch.distributed._symmetric_memory as symm_mem
        t = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(t, group)
    except Exception as e:  # noqa: BLE001
        print("symm-mem unavailable:", repr(e)[:200])

    # the floor of a Python path on this plan: one dict lookup, stream, pointer, one
    # 8-byte store for the agreement word, the C launcher
    fast = {(x.shape, x.dtype): plan}
    words = control.block.words if hasattr(control, "block") else None
    runner_launch = getattr(getattr(plan.compiled, "run", None), "launch", None)

    def floor(x=x):
        p = fast.get((x.shape, x.dtype))
        p.fire(_launcher.raw_stream(0), x.data_ptr(), op, *ints)

    rows = {
        "empty lambda": lambda: None,
        "x.shape": lambda: x.shape,
        "x.dtype": lambda: x.dtype,
        "x.device": lambda: x.device,
        "x.get_device()": lambda: x.get_device(),
        "x.is_contiguous()": lambda: x.is_contiguous(),
        "x.data_ptr()": lambda: x.data_ptr(),
        "key tuple + plans.get": lambda: comm.plans.get(("all_reduce", x.shape, x.dtype, x.device, "sum", "auto")),
        "hash(x.device)": lambda: hash(x.device),
        "hash(x.shape)": lambda: hash(x.shape),
        "sys._getframe(1)": lambda: sys._getframe(1),
        "lock acquire+release": lambda: (lock.acquire(False), lock.release()),
        "cudaStreamIsCapturing": cap,
        "raw stream": lambda: _launcher.raw_stream(0),
        "profiler_enabled": torch._C._autograd._profiler_enabled,
        "launcher.hooked()": _launcher.hooked,
        "trace.needed()": needed,
        "get_communicator()": get_communicator,
        "_adapt.on(comm)": lambda: _adapt.on(comm),
        "_across.spans_hosts(comm)": lambda: _across.spans_hosts(comm),
        "control.repeat(record)": lambda: control.repeat(rec),
        "outputs.take": lambda: plan.outputs.take(x, s, False),
        "fire (C launcher, bound)": lambda: fire(s, xp, op, *ints),
        "floor: lookup+stream+ptr+fire": floor,
        "plan.entry (C) from Python": (lambda: plan.entry(x)) if plan.entry is not None else None,
        "fast_call": lambda: fast_call(comm, key, x),
        "_host.run": lambda: run(ALL_REDUCE, x, "auto", "sum"),
        "commlab.all_reduce": lambda: commlab.all_reduce(x),
        "nccl dist.all_reduce": lambda: dist.all_reduce(x),
    }
    if t is not None:
        rows["symm-mem one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group)
    res = {}
    base = per_call_ns(rows.pop("empty lambda"), a.iters, a.reps)
    res["empty lambda"] = base
    for name, fn in rows.items():
        if fn is None:
            continue
        try:
            res[name] = per_call_ns(fn, a.iters, a.reps) - base
        except Exception as e:  # noqa: BLE001
            res[name] = f"error: {e!r:.200}"
        comm.synchronize()
    raw = getattr(plan.entry, "raw_launches", None)  # None: the entry used Triton's launcher
    if raw is not None:  # the same call with the C entry on Triton's launcher instead
        _rawlaunch.ALLOW[0] = False
        comm.plans.clear()
        commlab.all_reduce(x)
        commlab.all_reduce(x)
        name = "commlab.all_reduce, Triton's launcher"
        res[name] = per_call_ns(lambda: commlab.all_reduce(x), a.iters, a.reps) - base
        _rawlaunch.ALLOW[0] = True
    info = {"commit": os.environ.get("COMMLAB_COMMIT", ""), "raw_launches": raw,
            "toolchain": toolchain(), "native": os.environ.get("COMMLAB_NATIVE", "1"), "bytes": a.bytes, "tier": dict(_launcher.TIERS),
            "runner_launch": type(runner_launch).__name__, "words": words is not None,
            "python": sys.version.split()[0], "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0), "ns_per_call": res}
    for k, v in res.items():
        print(f"{k:<32} {v if isinstance(v, str) else f'{v:9.0f} ns'}")
    print(json.dumps(info["toolchain"]))
    if a.out:
        Path(a.out).write_text(json.dumps(info, indent=1))
    commlab.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
