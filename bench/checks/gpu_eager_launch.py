"""Launch plans' eager path on one GPU (issue 29): every launcher tier (commlab's own
cuLaunchKernel, Triton's C launcher, CompiledKernel.run, kernel[grid]) gives NCCL's answer,
outputs are reused only when nobody holds them, streams, CUDA graphs, Triton launch hooks
and unaligned inputs still work, and a mismatch after calls that ran ahead is raised on
both ranks of a world sharing the GPU.

    python bench/checks/gpu_eager_launch.py --out bench/results/h200-eager-launch-check.json

Prints one PASS/FAIL line per check and the host cost per call of each tier; exit 1 on
any FAIL. Each world has a time limit (a hang is a FAIL, never a wait).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import commlab  # noqa: E402
from commlab.collectives import _launcher, _outputs, _rawlaunch  # noqa: E402

RESULTS: list[dict] = []
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def report(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def nccl(op: str, comm, x: torch.Tensor) -> torch.Tensor:
    g = comm.group
    if op == "all_reduce":
        y = x.clone()
        dist.all_reduce(y, group=g)
        return y
    if op == "broadcast":
        y = x.clone()
        dist.broadcast(y, src=0, group=g)
        return y
    if op == "all_gather":
        y = torch.empty(comm.world_size * x.numel(), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(y, x, group=g)
        return y
    if op == "reduce_scatter":
        y = torch.empty(x.numel() // comm.world_size, dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(y, x, group=g)
        return y
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x, group=g)
    return y


def same(a: torch.Tensor, b: torch.Tensor) -> str:
    try:
        torch.testing.assert_close(a.reshape(-1).float(), b.reshape(-1).float(),
                                   rtol=2e-2, atol=2e-2)
    except AssertionError as e:
        return str(e).split("\n")[1][:200]
    return ""


def per_call_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def raw_launches(comm) -> int:
    """Launches the plans' C entries made through commlab's own cuLaunchKernel."""
    return sum(getattr(p.entry, "raw_launches", None) or 0 for p in comm.plans.values())


def check_tiers(comm, timing: dict) -> None:
    """Each tier: a repeated call (the plan's path) of every op gives NCCL's answer."""
    for tiers in (["raw", "c", "run"], ["c", "run"], ["run"], []):
        label = "+".join(tiers) or "kernel[grid]"
        _launcher.ALLOW[:] = [t for t in tiers if t != "raw"]
        _rawlaunch.ALLOW[0] = "raw" in tiers
        comm.plans.clear()
        before = dict(_launcher.TIERS)
        raw_before = dict(_rawlaunch.BUILT)
        bad = []
        for op in OPS:
            for dtype, nbytes in ((torch.bfloat16, 8), (torch.bfloat16, 4096),
                                  (torch.float32, 1 << 20), (torch.int32, 96)):
                n = max(comm.world_size, nbytes // dtype.itemsize)
                x = (torch.randn(n, device=comm.device) * 4).to(dtype)
                fn = getattr(commlab, op)
                fn(x)  # slow path: leaves the plan
                raw0 = raw_launches(comm)
                for _ in range(3):
                    got = fn(x)  # the plan
                err = same(got, nccl(op, comm, x))
                if err:
                    bad.append(f"{op} {dtype} {nbytes} B: {err}")
                if "raw" in tiers and raw_launches(comm) - raw0 < 3:
                    bad.append(f"{op} {dtype} {nbytes} B: not launched through cuLaunchKernel")
        bound = {k: _launcher.TIERS[k] - before[k] for k in before}
        bound.update({f"raw-{k}": _rawlaunch.BUILT[k] - raw_before[k] for k in raw_before})
        report(f"tier {label}: every op's repeated call equals NCCL", not bad,
               f"plans bound {bound}; " + "; ".join(bad[:3]))
        x = torch.randn(4096, device=comm.device).to(torch.bfloat16)
        timing[label] = per_call_us(lambda: commlab.all_reduce(x))
    _launcher.ALLOW[:] = ["c", "run"]
    _rawlaunch.ALLOW[0] = True
    comm.plans.clear()
    print("host us per eager all_reduce 8 KiB bf16, by tier:",
          ", ".join(f"{k} {v:.2f}" for k, v in timing.items()), flush=True)


def check_outputs(comm) -> None:
    dev = comm.device
    xs = [torch.full((2048,), float(i + 1), device=dev) for i in range(2 * _outputs.SLOTS)]
    commlab.all_reduce(xs[0])
    held = [commlab.all_reduce(x) for x in xs]  # every result kept: none may be reused
    torch.cuda.synchronize()
    wrong = [i for i, (h, x) in enumerate(zip(held, xs, strict=True))
             if same(h, nccl("all_reduce", comm, x))]
    ptrs = {h.data_ptr() for h in held}
    report("held results are never overwritten", not wrong and len(ptrs) == len(held),
           f"wrong {wrong}, {len(ptrs)} distinct buffers for {len(held)} results")
    del held
    view = commlab.all_reduce(xs[1]).view(32, 64)  # only a view survives
    for x in xs:
        commlab.all_reduce(x)
    torch.cuda.synchronize()
    report("a view of a dropped result keeps it", not same(view, nccl("all_reduce", comm, xs[1])))
    a = commlab.all_reduce(xs[2])
    p = a.data_ptr()
    del a
    b = commlab.all_reduce(xs[3])
    report("a dropped result's buffer is reused", b.data_ptr() == p
           and not same(b, nccl("all_reduce", comm, xs[3])), f"{p:#x} -> {b.data_ptr():#x}")


def check_streams_graphs_hooks(comm) -> None:
    dev = comm.device
    x = torch.randn(4096, device=dev)
    ref = nccl("all_reduce", comm, x)
    commlab.all_reduce(x)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = [commlab.all_reduce(x) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    main = [commlab.all_reduce(x) for _ in range(3)]
    torch.cuda.synchronize()
    report("calls on a side stream, then the current one", all(
        not same(t, ref) for t in on_side + main))

    static = torch.randn(4096, device=dev)
    sref = nccl("all_reduce", comm, static)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            commlab.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = commlab.all_reduce(static)
    eager = [commlab.all_reduce(x) for _ in range(6)]
    graph.replay()
    torch.cuda.synchronize()
    report("a captured call's output is the graph's alone", not same(gout, sref) and all(
        not same(t, ref) and t.data_ptr() != gout.data_ptr() for t in eager))

    try:
        from triton import knobs
    except ImportError:
        report("launch hook falls back to kernel[grid]", True, "skipped: no triton.knobs")
    else:
        seen: list = []
        before = knobs.runtime.launch_enter_hook

        def hook(meta):
            seen.append(1)

        if hasattr(before, "add"):  # a HookChain (newer Triton)
            before.add(hook)
        else:
            knobs.runtime.launch_enter_hook = hook
        try:
            out = commlab.all_reduce(x)
            torch.cuda.synchronize()
        finally:
            if hasattr(before, "remove"):
                before.remove(hook)
            else:
                knobs.runtime.launch_enter_hook = before
        report("launch hook falls back to kernel[grid]", bool(seen) and not same(out, ref),
               f"hook saw {len(seen)} launch(es)")

    big = torch.randn(4097, device=dev).to(torch.bfloat16)
    aligned, odd = big[:4096], big[1:]  # same key; the second 2 bytes off 16-byte alignment
    commlab.all_reduce(aligned)
    commlab.all_reduce(aligned)
    out = commlab.all_reduce(odd)
    report("an unaligned input of a cached shape", not same(out, nccl("all_reduce", comm, odd)))


def _mismatch_world(comm) -> str:
    """Rank 0 repeats all_reduce (running ahead) while rank 1 switches to all_gather."""
    x = torch.ones(1024, device=comm.device)
    for _ in range(6):
        commlab.all_reduce(x)
    try:
        if comm.rank == 0:
            commlab.all_reduce(x)
            commlab.synchronize()
        else:
            commlab.all_gather(x)
    except commlab.RankMismatchError:
        ok = commlab.all_reduce(x)  # the world goes on
        torch.cuda.synchronize()
        return "" if float(ok[0]) == comm.world_size else f"after the error: {float(ok[0])}"
    return "no RankMismatchError"


def check_shared_world() -> None:
    from commlab.testing import run_world

    t0 = time.monotonic()
    try:
        got = run_world(_mismatch_world, 2, backend="cuda", timeout=180)
        report("mismatch after ranks ran ahead: raised on both ranks of a shared GPU",
               not any(got), f"{got}, {time.monotonic() - t0:.0f} s")
    except Exception as e:  # noqa: BLE001 - a failure here is reported, not raised
        report("mismatch after ranks ran ahead: raised on both ranks of a shared GPU", False,
               f"{type(e).__name__}: {str(e)[:300]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/h200-eager-launch-check.json")
    ap.add_argument("--no-world", action="store_true", help="skip the 2-rank world")
    args = ap.parse_args()
    import triton

    comm = commlab.init(backend="cuda")
    timing: dict = {}
    try:
        check_tiers(comm, timing)
        check_outputs(comm)
        check_streams_graphs_hooks(comm)
    except Exception as e:  # noqa: BLE001
        report("single-rank checks ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        commlab.finalize()
    if not args.no_world:
        check_shared_world()
    failed = [r for r in RESULTS if not r["ok"]]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "triton": triton.__version__, "commit": os.environ.get("COMMLAB_COMMIT", ""),
        "host_us_per_call_by_tier": timing, "checks": RESULTS}, indent=1) + "\n")
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
