"""The IPC heap on one GPU, quickly: worlds of 2 and 4 ranks sharing it (heap "ipc", one
line saying so), every all_reduce algorithm against gloo, a peer stamp through
``cl.symm_at``, COMMLAB_HEAP=symmetric refused on every rank, the torch backend on cuda
(a native all_reduce and a staged send/recv), and GPU memory given back after a world
ends normally and after a rank is SIGKILLed.

    python bench/checks/gpu_ipc_smoke.py        # PASS/FAIL lines, exit 1 on a failure
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from commlab.testing import WorldError, run_world

FAILS: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILS.append(what)


def used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                          "nounits"], capture_output=True, text=True).stdout
    return int(out.split()[0])


@triton.jit
def _stamp_kernel(t_ptr, ctx):
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    for p in range(0, world):
        tl.store(cl.symm_at(t_ptr + me, p, ctx), me + 1)
    cl.barrier(ctx)


def world_fn(comm) -> dict:
    out: dict = {"heap": comm.heap_kind, "shared": comm.shared_gpu, "repr": repr(comm),
                 "errors": []}
    gen = torch.Generator().manual_seed(comm.rank)
    for n in (1, 1000, 4099, 1 << 20):
        x = torch.randn(n, generator=gen)
        ref = x.clone()
        dist.all_reduce(ref, group=comm.cpu_group)
        for alg in ("one_shot", "two_shot", "ring", "auto"):
            try:
                y = commlab.all_reduce(x.cuda(), algorithm=alg).cpu()
                err = (y - ref).abs().max().item()
                if err > 1e-4 * max(1.0, ref.abs().max().item()):
                    out["errors"].append(f"all_reduce {alg} n={n}: max err {err}")
            except Exception as e:
                out["errors"].append(f"all_reduce {alg} n={n}: {type(e).__name__}: {e}")
    t = commlab.symmetric_zeros((comm.world_size,), dtype=torch.int32)
    _stamp_kernel[(1,)](t, comm.context)
    torch.cuda.synchronize()
    out["stamps"] = t.cpu().tolist()
    x = torch.ones(1 << 10, device=comm.device)
    for _ in range(5):
        commlab.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        commlab.all_reduce(x)
    torch.cuda.synchronize()
    out["us_per_call"] = (time.perf_counter() - t0) / 50 * 1e6
    return out


def refuse_fn(comm) -> str:
    try:
        commlab.init(backend="cuda")
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "built"


def torch_backend_fn(comm) -> dict:
    dist.init_process_group("cpu:gloo,cuda:commlab")
    r, w = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(commlab.init().device)
    x = torch.full((5,), float(r + 1), device="cuda")
    dist.all_reduce(x)
    y = torch.zeros(3, device="cuda")
    if r == 0:
        dist.send(torch.arange(3.0, device="cuda"), 1)
    elif r == 1:
        dist.recv(y, 0)
    out = {"sum": x.cpu().tolist(), "recv": y.cpu().tolist(), "rank": r, "world": w,
           "heap": commlab.init().heap_kind}
    dist.destroy_process_group()
    return out


def killed_fn(comm) -> None:
    commlab.all_reduce(torch.ones(4, device=comm.device))
    torch.cuda.synchronize()
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3)


def main() -> int:
    base = used_mib()
    print(f"GPU memory used before: {base} MiB; torch {torch.__version__}", flush=True)
    for n in (2, 4):
        t0 = time.monotonic()
        res = run_world(world_fn, n, backend="cuda", timeout=300,
                        env={"COMMLAB_TIMEOUT": "60"})
        check(all(r["heap"] == "ipc" for r in res), f"w{n}: heap ipc ({res[0]['repr']})")
        check(all("share one GPU" in r["shared"] for r in res), f"w{n}: {res[0]['shared']}")
        errs = [e for r in res for e in r["errors"]]
        check(not errs, f"w{n}: every all_reduce algorithm matches gloo {errs[:3]}")
        check(all(r["stamps"] == list(range(1, n + 1)) for r in res),
              f"w{n}: peer stamps through symm_at {[r['stamps'] for r in res]}")
        print(f"  w{n}: eager all_reduce 4 KiB {[round(r['us_per_call']) for r in res]} "
              f"us/call; world took {time.monotonic() - t0:.1f} s", flush=True)
        time.sleep(2)
        check(used_mib() - base < 300, f"w{n}: memory back after the world ({used_mib()} MiB)")
    res = run_world(refuse_fn, 2, backend="cuda", timeout=120, init=False,
                    env={"COMMLAB_HEAP": "symmetric"})
    check(all("refuses allocations from overlapping devices" in r for r in res),
          f"COMMLAB_HEAP=symmetric refused on every rank: {res[0][:160]}")
    res = run_world(torch_backend_fn, 2, backend="cuda", timeout=180, init=False)
    check(all(r["sum"] == [3.0] * 5 for r in res) and res[1]["recv"] == [0.0, 1.0, 2.0]
          and res[0]["heap"] == "ipc", f"torch backend on cuda, shared GPU: {res}")
    try:
        run_world(killed_fn, 3, backend="cuda", timeout=120)
        check(False, "killed rank: the world should report rank 1's death")
    except WorldError as e:
        check(1 in e.failures, f"killed rank reported: {sorted(e.failures)}")
    time.sleep(3)
    check(used_mib() - base < 300, f"memory back after a SIGKILLed rank ({used_mib()} MiB)")
    print("gpu_ipc_smoke:", "PASS" if not FAILS else f"FAIL {FAILS}", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
