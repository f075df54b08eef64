"""Overlapped all-gather+GEMM and GEMM+reduce-scatter on GPUs: check, then time side by side.

    torchrun --nproc-per-node 2 -m commlab.bench.overlap --out bench/results

1. Correctness: commlab.ag_gemm / gemm_rs (fused) against NCCL + torch.matmul on fresh
   random data, bf16 and fp16, shapes that are not multiples of the tiles.
2. Timing (bf16, Llama-3 8B/70B tensor-parallel MLP projections, M in 512..16384), every
   impl in the same run: "sequential" (NCCL, then torch.matmul / the reverse),
   "commlab:fused" (forced), "commlab:sequential" (commlab's own collective, then
   torch.matmul / the reverse), "commlab:auto" (the dispatch rule), "torch_symm_mem:fused"
   (torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter),
   "comm_only" (the NCCL collective alone), "gemm_only" (torch.matmul alone) and
   "triton_gemm_only" (the fused kernels' own Triton GEMM alone, commlab.overlap.matmul).
   Each: warm-up, then the median of per-call CUDA-event times over back-to-back calls
   queued behind a device sleep (so the events bracket device time, not the host's
   Python), the slowest rank's median; --rounds interleaved rounds per shape (every impl
   once per round), the median round recorded with mode "queued" (all rounds kept in
   the record). --eager times plain back-to-back calls instead (mode "eager": host
   overhead included).

   hidden = (sequential - fused) / comm_only: the share of the communication the overlap
   hid (1.0 = all of it; the target is >= 0.8 at M >= 2048).
3. One traced call per op (tile timeline) saved for notebooks/05-overlap.ipynb.

Writes DIR/overlap-<machine>-w<W>.json (records) and DIR/overlap-trace-<machine>.json.
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

import commlab
from commlab import overlap
from commlab.bench._records import device_name, git_commit, machine_tag
from commlab.bench._timing import QUEUE_SLEEP_CYCLES, time_per_call

# NVLink multicast stays off (NCCL NVLS, PyTorch symmetric memory, NVSHMEM); main() sets
# these before the process group starts
SAFE_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
            "NVSHMEM_DISABLE_NVLS": "1"}

# Llama-3 tensor-parallel MLP projections at W=2 (the anchors' shapes): (K, N) of the local GEMM
SHAPES = {
    "ag_gemm": {"8B": (4096, 14336), "70B": (8192, 28672)},
    "gemm_rs": {"8B": (7168, 4096), "70B": (14336, 8192)},
}
MS = (512, 2048, 8192, 16384)


def log(comm, *a):
    if comm.rank == 0:
        print(*a, flush=True)


# --- the implementations, each a () -> tensor closure over fresh inputs -------------


def make_impls(comm, op: str, m: int, k: int, n: int, dtype=torch.bfloat16) -> dict:
    matmul = overlap.matmul
    dev, w = comm.device, comm.world_size
    g = torch.Generator(device=dev).manual_seed(17 + comm.rank)
    group_name = comm.group.group_name
    if op == "ag_gemm":
        a = torch.randn(m // w, k, device=dev, generator=g).to(dtype)
        b = (torch.randn(k, n, device=dev, generator=g) / k**0.5).to(dtype)
        full = torch.empty(m, k, device=dev, dtype=dtype)
        impls = {
            "sequential": lambda: (dist.all_gather_into_tensor(full, a, group=comm.group),
                                   full @ b)[1],
            "commlab:fused": lambda: commlab.ag_gemm(a, b, algorithm="fused"),
            "commlab:auto": lambda: commlab.ag_gemm(a, b),
            "commlab:sequential": lambda: commlab.ag_gemm(a, b, algorithm="sequential"),
            "comm_only": lambda: dist.all_gather_into_tensor(full, a, group=comm.group),
            "gemm_only": lambda: full @ b,
            "triton_gemm_only": lambda: matmul(comm, full, b),
        }
        if hasattr(torch.ops.symm_mem, "fused_all_gather_matmul"):
            impls["torch_symm_mem:fused"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(
                a, [b], 0, group_name, return_A=False)[1][0]
    else:
        a = torch.randn(m, k, device=dev, generator=g).to(dtype)
        b = (torch.randn(k, n, device=dev, generator=g) / k**0.5).to(dtype)
        part = torch.empty(m, n, device=dev, dtype=dtype)
        out = torch.empty(m // w, n, device=dev, dtype=dtype)
        impls = {
            "sequential": lambda: (torch.matmul(a, b, out=part),
                                   dist.reduce_scatter_tensor(out, part, group=comm.group)),
            "commlab:fused": lambda: commlab.gemm_rs(a, b, algorithm="fused"),
            "commlab:auto": lambda: commlab.gemm_rs(a, b),
            "commlab:sequential": lambda: commlab.gemm_rs(a, b, algorithm="sequential"),
            "comm_only": lambda: dist.reduce_scatter_tensor(out, part, group=comm.group),
            "gemm_only": lambda: torch.matmul(a, b, out=part),
            "triton_gemm_only": lambda: matmul(comm, a, b),
        }
        if hasattr(torch.ops.symm_mem, "fused_matmul_reduce_scatter"):
            impls["torch_symm_mem:fused"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
                a, b, "sum", 0, group_name)
    return impls


def time_us(comm, fn, warmup: int, iters: int, queued: bool = True) -> float:
    """Median per-call device time (us), the slowest rank's (``time_per_call``)."""
    return time_per_call(fn, iters, warmup=warmup, queued=queued, group=comm.cpu_group)


# --- 1. correctness ------------------------------------------------------------------


def check(comm) -> int:
    dev, w = comm.device, comm.world_size
    g = torch.Generator(device=dev).manual_seed(1000 + comm.rank)
    fails = 0
    cases = [(1000, 1000, 4000, 1000), (2048, 2048, 4096, 14336), (130, 136, 200, 300)]
    for dtype, tol in ((torch.bfloat16, 1e-2), (torch.float16, 2e-3)):
        for rows, k_ag, k_rs, n in cases:
            for op, algo in [(o, al) for o in ("ag_gemm", "gemm_rs")
                             for al in ("fused", "sequential")]:
                for _rep in range(3):  # repeated calls cross both buffer parities
                    if op == "ag_gemm":
                        a = torch.randn(rows, k_ag, device=dev, generator=g).to(dtype)
                        b = torch.randn(k_ag, n, device=dev, generator=g).to(dtype)
                        got = commlab.ag_gemm(a, b, algorithm=algo)
                        full = torch.empty(rows * w, k_ag, device=dev, dtype=dtype)
                        dist.all_gather_into_tensor(full, a, group=comm.group)
                        ref = full.float() @ b.float()
                    else:
                        a = torch.randn(rows * w, k_rs, device=dev, generator=g).to(dtype)
                        b = torch.randn(k_rs, n, device=dev, generator=g).to(dtype)
                        got = commlab.gemm_rs(a, b, algorithm=algo)
                        part = (a.float() @ b.float()).to(dtype).float()
                        ref = torch.empty(rows, n, device=dev)
                        dist.reduce_scatter_tensor(ref, part, group=comm.group)
                    scale = tol * max(1.0, ref.abs().max().item())
                    err = (got.float() - ref).abs().max().item()
                    if got.shape != ref.shape or not err <= scale:
                        fails += 1
                        print(f"[rank {comm.rank}] FAIL {op} {algo} {dtype} rows={rows} n={n}: "
                              f"max err {err:.4g} > {scale:.4g}", flush=True)
    t = torch.tensor([fails], device=dev)
    dist.all_reduce(t, group=comm.group)
    log(comm, f"correctness: {'ok' if t.item() == 0 else f'{t.item()} FAILURES'} "
              f"({len(cases) * 2 * 4 * 3} calls per rank, bf16 + fp16, odd shapes)")
    return int(t.item())


# --- 2. timing -----------------------------------------------------------------------


def bench(comm, args, save) -> list[dict]:
    """Time every impl at every shape; ``save(records)`` after each shape (a time limit
    keeps what ran)."""
    records, dev_name = [], device_name(comm)
    commit = git_commit()  # no .git on some machines
    ms = [int(x) for x in args.m_values.split(",")]
    models = args.models.split(",")
    header = (f"{'op':8} {'model':5} {'M':>6} {'seq':>8} {'cl seq':>8} {'fused':>8} "
              f"{'auto':>8} {'torch':>8} {'comm':>7} {'gemm':>8} {'tr gemm':>8} {'hidden':>7} "
              f"{'vs seq':>7} {'vs torch':>8}")
    log(comm, header)
    for op in ("ag_gemm", "gemm_rs"):
        for model in models:
            k, n = SHAPES[op][model]
            for m in ms:
                impls = make_impls(comm, op, m, k, n)
                iters = args.iters if m * k * n < 2**38 else max(20, args.iters // 2)
                rounds: dict[str, list[float]] = {name: [] for name in impls}
                for _ in range(args.rounds):  # interleaved, so drift hits every impl alike
                    for name, fn in impls.items():
                        rounds[name].append(time_us(comm, fn, args.warmup, iters,
                                                    queued=not args.eager))
                t = {}
                for name in impls:
                    t[name] = statistics.median(rounds[name])
                    records.append(dict(op=op, impl=name, m=m, n=n, k=k, dtype="bfloat16",
                                        world_size=comm.world_size, time_us=round(t[name], 2),
                                        device=dev_name, commit=commit,
                                        mode="eager" if args.eager else "queued",
                                        model=f"llama3-{model}",
                                        rounds=[round(v, 2) for v in rounds[name]]))
                del impls
                save(records)
                seq, fused, comm_t = t["sequential"], t["commlab:fused"], t["comm_only"]
                tt = t.get("torch_symm_mem:fused", float("nan"))
                log(comm, f"{op:8} {model:5} {m:6d} {seq:8.1f} {t['commlab:sequential']:8.1f} "
                          f"{fused:8.1f} {t['commlab:auto']:8.1f} {tt:8.1f} {comm_t:7.1f} "
                          f"{t['gemm_only']:8.1f} {t['triton_gemm_only']:8.1f} "
                          f"{(seq - fused) / comm_t:7.0%} {fused / seq - 1:+7.1%} "
                          f"{fused / tt - 1:+8.1%}")
    log(comm, "hidden = (sequential - fused) / comm_only; vs seq / vs torch: fused time "
              "relative to sequential / torch_symm_mem:fused (negative = faster)")
    return records


def parse_tile(text: str):
    """"128x256x64w8s3" -> TileConfig(BM=128, BN=256, BK=64, GROUP_M=8, warps 8, stages 3)."""
    dims, rest = text.split("w")
    bm, bn, bk = (int(v) for v in dims.split("x"))
    warps, stages = (int(v) for v in rest.split("s"))
    return overlap.TileConfig(bm, bn, bk, 8, warps, stages)


def tile_sweep(comm, args) -> list[dict]:
    """The fused kernels under other tile configurations (same timing as bench())."""
    default = overlap.GPU_TILE
    tiles = [default] + [parse_tile(t) for t in args.tiles.split(",") if t]
    name = lambda c: f"{c.BM}x{c.BN}x{c.BK}w{c.num_warps}s{c.num_stages}"  # noqa: E731
    records, commit = [], git_commit()
    log(comm, "tile sweep (fused us): " + "  ".join(name(c) for c in tiles))
    for op in ("ag_gemm", "gemm_rs"):
        fn = commlab.ag_gemm if op == "ag_gemm" else commlab.gemm_rs
        for model in args.models.split(","):
            k, n = SHAPES[op][model]
            for m in (int(x) for x in args.m_values.split(",")):
                g = torch.Generator(device=comm.device).manual_seed(5)
                rows = m // comm.world_size if op == "ag_gemm" else m
                a = torch.randn(rows, k, device=comm.device, generator=g).bfloat16()
                b = (torch.randn(k, n, device=comm.device, generator=g) / k**0.5).bfloat16()
                ref = fn(a, b, algorithm="sequential").float()
                tol = 1e-2 * ref.abs().max().clamp(min=1.0)
                dist.all_reduce(tol, op=dist.ReduceOp.MAX, group=comm.group)
                tol = tol.item()
                row = []
                for cfg in tiles:
                    try:
                        with overlap.launch_options(gpu_tile=cfg):
                            err = (fn(a, b, algorithm="fused").float() - ref).abs().max()
                            dist.all_reduce(err, op=dist.ReduceOp.MAX, group=comm.group)
                            err = err.item()  # every rank takes the same branch below
                            if not err <= tol:  # a wrong result is a failure, not a time
                                raise AssertionError(f"max error {err:.3g} > {tol:.3g}")
                            t = time_us(comm, lambda: fn(a, b, algorithm="fused"), 3,  # noqa: B023 (timed here)
                                        max(10, args.iters // 2))
                    except Exception as e:  # e.g. out of shared memory: report, go on
                        log(comm, f"  {name(cfg)} failed: {type(e).__name__}: {e}"[:200])
                        t = float("nan")
                    row.append(t)
                    records.append(dict(op=op, impl="commlab:fused", tile=name(cfg), m=m, n=n,
                                        k=k, dtype="bfloat16", world_size=comm.world_size,
                                        time_us=round(t, 2), device=device_name(comm),
                                        commit=commit, mode="queued", model=f"llama3-{model}"))
                log(comm, f"{op:8} {model:5} {m:6d} " + " ".join(f"{t:9.1f}" for t in row))
    return records


# --- 3. one traced call per op --------------------------------------------------------


def traced(comm) -> list[dict]:
    dev, w = comm.device, comm.world_size
    spans = []
    for op, (k, n) in (("ag_gemm", SHAPES["ag_gemm"]["8B"]), ("gemm_rs", SHAPES["gemm_rs"]["8B"])):
        m = 4096
        a = torch.randn(m // w if op == "ag_gemm" else m, k, device=dev).bfloat16()
        b = (torch.randn(k, n, device=dev) / k**0.5).bfloat16()
        fn = commlab.ag_gemm if op == "ag_gemm" else commlab.gemm_rs
        # warm-up with a trace on: the traced kernels are compiled variants of their own
        # (TRACE=True); compiled inside the recorded call, gemm_rs's second launch would
        # start a second after its first. (One call would do, the epoch is not
        # specialized; the second keeps the recorded traces comparable with older ones.)
        commlab.trace.start()
        fn(a, b, algorithm="fused")
        fn(a, b, algorithm="fused")
        commlab.trace.stop()
        torch.cuda.synchronize()
        dist.barrier(group=comm.cpu_group)
        commlab.trace.start()
        # queued behind a device sleep, as the timed calls are: the timeline shows the
        # GPU's time, not gaps where it waited for the host to launch the next kernel
        # (traced, gemm_rs's own-chunk launch otherwise started 147-773 us after its
        # first launch ended, bench/results/rs-variants-2xh200.json)
        torch.cuda._sleep(QUEUE_SLEEP_CYCLES)
        fn(a, b, algorithm="fused")
        got = commlab.trace.stop()
        spans += [dict(s.to_dict(), op=op, m=m, n=n, k=k) for s in got]
    return spans


def main(argv=None) -> int:
    for k, v in SAFE_ENV.items():
        os.environ.setdefault(k, v)
    p = argparse.ArgumentParser(prog="python -m commlab.bench.overlap",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results", help="directory for the JSON files")
    p.add_argument("--m-values", default=",".join(map(str, MS)), help="comma-separated M values")
    p.add_argument("--models", default="8B,70B")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds per shape; the median round is recorded")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--trace-only", action="store_true",
                   help="only record the traced calls (overlap-trace-*.json)")
    p.add_argument("--eager", action="store_true", help="time without queueing (host included)")
    p.add_argument("--tiles", default="",
                   help="also time the fused kernels under these tile configs, e.g. "
                        "128x128x64w8s4,256x128x64w8s3 (written to overlap-tiles-*.json)")
    args = p.parse_args(argv)
    t0 = time.time()
    comm = commlab.init(backend="cuda", heap_size="6GiB", scratch_size="256MiB")
    torch.cuda.set_device(comm.device)
    try:  # older torch needs this before its fused ops; newer ones enable it themselves
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        group = comm.group
        assert isinstance(group, dist.ProcessGroup)  # init(backend="cuda") made an NCCL one
        enable_symm_mem_for_group(group.group_name)
    except Exception as e:  # the torch impl is then reported as missing, not fatal
        log(comm, f"torch symmetric memory not enabled: {e}")
    log(comm, f"{comm.world_size} x {device_name(comm)}, torch {torch.__version__}")
    fails = 0 if args.skip_check or args.trace_only else check(comm)
    out, tag = Path(args.out), machine_tag(comm)
    rec_path = out / f"overlap-{tag}-w{comm.world_size}.json"

    def save(records):
        if comm.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            rec_path.write_text(json.dumps(records, indent=1) + "\n")

    records = [] if args.trace_only else bench(comm, args, save)
    tile_records = tile_sweep(comm, args) if args.tiles else []
    spans = traced(comm)
    all_spans: list[list[dict]] = [[] for _ in range(comm.world_size)]  # gather fills
    dist.all_gather_object(all_spans, spans, group=comm.cpu_group)
    if comm.rank == 0:  # (the records are saved: bench() writes them after every shape)
        trace_path = out / f"overlap-trace-{tag}.json"
        trace_path.write_text(json.dumps([s for r in all_spans for s in r]) + "\n")
        if tile_records:
            (out / f"overlap-tiles-{tag}-w{comm.world_size}.json").write_text(
                json.dumps(tile_records, indent=1) + "\n")
        print(f"wrote {'' if args.trace_only else f'{rec_path} ({len(records)} records), '}"
              f"{trace_path}; "
              f"{time.time() - t0:.0f} s", flush=True)
    commlab.finalize()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
