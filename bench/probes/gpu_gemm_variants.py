"""Which form of the Triton GEMM is fastest on this GPU? One GPU, no communication.

    python bench/probes/gpu_gemm_variants.py --out DIR                # split tail off/on
    python bench/probes/gpu_gemm_variants.py --out DIR --what forms   # the store/loop forms

"--what tail" (default) times commlab's own GEMM (``commlab.overlap.matmul``, the
fused kernels' tile loop) with the partial last wave's tiles whole ("off") and split
along K ("on", the default: ``commlab.overlap.schedule``), next to cuBLAS, on every local GEMM of commlab.bench.overlap: the all-gather
GEMMs at M rows, the reduce-scatter GEMMs at M and M/2 rows (the fused gemm_rs launches
one GEMM per row chunk). Writes DIR/gemm-split-tail.json.

"--what forms" (below) is the earlier study of the tile loop's forms.

The overlapped kernels (commlab.overlap) pay for their overlap with a Triton GEMM in
place of cuBLAS; on 2xH200 that GEMM was 0.5-4% slower than cuBLAS on the Llama-3 8B
shapes (bench/results/overlap-2xh200-w2.json, impl "triton_gemm_only"), which caps the
share of the communication they can hide. This script times variants of one persistent
TMA GEMM against torch.matmul (cuBLAS) on the shapes the overlap benchmark uses:

    base      TMA loads, a pointer store of the tile (what commlab.overlap runs)
    tma_store the tile stored through a TMA descriptor
    subtile   TMA store in two column halves (less shared memory for the epilogue)
    flatten   tl.range(..., flatten=True): the compiler pipelines across tiles
    ws        tl.range(..., warp_specialize=True): producer/consumer warps

(warp specialization last: the riskiest to compile). Each: warm-up, median of 20 CUDA-event timed calls;
every variant's result is checked against cuBLAS first. Writes DIR/gemm-variants.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from commlab import overlap
from commlab.bench import time_per_call

# (name, M, K, N): the local GEMMs of commlab.bench.overlap (W=2)
SHAPES = [("ag 8B", 8192, 4096, 14336), ("rs 8B", 8192, 7168, 4096)]
# (variant, its switches, tile): warp specialization last (the riskiest to compile)
RUNS = [("base", {}, "128x256x64w8s3"), ("base", {}, "128x256x64w8s4"),
        ("tma_store", {"TMA_STORE": True}, "128x256x64w8s3"),
        ("subtile", {"TMA_STORE": True, "SUBTILE": True}, "128x256x64w8s3"),
        ("flatten", {"FLATTEN": True}, "128x256x64w8s3"),
        ("ws", {"WS": True}, "128x256x64w8s3"),
        ("ws+subtile", {"WS": True, "TMA_STORE": True, "SUBTILE": True}, "128x256x64w8s3")]


@triton.jit
def gemm_variant(a_desc, b_desc, c_desc, c_ptr, M, N, K, NUM_SMS: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                 TMA_STORE: tl.constexpr, SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
                 WS: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    tiles = num_m * num_n
    for tile in tl.range(pid, tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        width = GROUP_M * num_n
        first_m = (tile // width) * GROUP_M
        group_rows = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % width) % group_rows
        pid_n = (tile % width) // group_rows
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BM, ki * BK])
            b = b_desc.load([ki * BK, pid_n * BN])
            acc = tl.dot(a, b, acc)
        if TMA_STORE:
            if SUBTILE:
                acc3 = tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1))
                c0, c1 = tl.split(acc3)
                c_desc.store([pid_m * BM, pid_n * BN], c0.to(tl.bfloat16))
                c_desc.store([pid_m * BM, pid_n * BN + BN // 2], c1.to(tl.bfloat16))
            else:
                c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))
        else:
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_n = pid_n * BN + tl.arange(0, BN)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(c_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
                     acc.to(tl.bfloat16), mask=mask)


def run_variant(a, b, tile: str, flags: dict, sms: int):
    dims, rest = tile.split("w")
    bm, bn, bk = (int(v) for v in dims.split("x"))
    warps, stages = (int(v) for v in rest.split("s"))
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    sub = flags.get("SUBTILE", False)
    descs = (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
             TensorDescriptor.from_tensor(c, [bm, bn // 2 if sub else bn]))
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    kw = dict(TMA_STORE=False, SUBTILE=False, FLATTEN=False, WS=False) | flags

    def fn():
        gemm_variant[grid](*descs, c, m, n, k, NUM_SMS=grid[0], BM=bm, BN=bn, BK=bk, GROUP_M=8,
                           num_warps=warps, num_stages=stages, **kw)
        return c
    return fn


def time_us(fn) -> float:
    return time_per_call(fn, 20, warmup=5, sleep_cycles=20_000_000)


def save(out_dir: str, dev, records: list) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm-variants.json").write_text(json.dumps(dict(
        device=torch.cuda.get_device_name(dev), torch=torch.__version__,
        triton=triton.__version__, records=records), indent=1) + "\n")


# (op, model, K, N) of commlab.bench.overlap, W=2
SK_SHAPES = [("ag", "8B", 4096, 14336), ("ag", "70B", 8192, 28672),
             ("rs", "8B", 7168, 4096), ("rs", "70B", 14336, 8192)]
SK_MS = (512, 2048, 8192, 16384)
MODES = ("off", "on")
ROUNDS = 3


def split_tail(out_dir: str, dev) -> None:
    from types import SimpleNamespace

    comm = SimpleNamespace(backend="cuda", device=dev)
    records = []
    for op, model, k, n in SK_SHAPES:
        for m_total in SK_MS:
            for m in (m_total,) if op == "ag" else (m_total, m_total // 2):
                g = torch.Generator(device=dev).manual_seed(3)
                a = torch.randn(m, k, device=dev, generator=g).bfloat16()
                b = (torch.randn(k, n, device=dev, generator=g) / k**0.5).bfloat16()
                ref = a @ b
                tiles = triton.cdiv(m, overlap.GPU_TILE.BM) * triton.cdiv(n, overlap.GPU_TILE.BN)
                times: dict = {mode: [] for mode in MODES}
                cublas_t = []
                for rnd in range(ROUNDS):  # interleaved: clock drift hits every mode alike
                    cublas_t.append(time_us(lambda: a @ b))
                    for mode in MODES:
                        with overlap.launch_options(split_tail=mode == "on"):
                            if rnd == 0:
                                out = overlap.matmul(comm, a, b)
                                err = (out.float() - ref.float()).abs().max().item()
                                if not err <= 2e-2 * max(1.0, ref.float().abs().max().item()):
                                    raise AssertionError(f"{op} {model} M={m} split tail "
                                                         f"{mode}: wrong result, max error "
                                                         f"{err:.3g}")
                            times[mode].append(time_us(lambda: overlap.matmul(comm, a, b)))
                cublas = sorted(cublas_t)[ROUNDS // 2]
                line = f"{op} {model:3} M={m:5d} cuBLAS {cublas:7.1f}"
                rec = dict(op=op, model=model, m=m, k=k, n=n, cublas_us=cublas)
                for mode in MODES:
                    with overlap.launch_options(split_tail=mode == "on"):
                        sched = overlap.schedule(comm, overlap.GPU_TILE, tiles, k)
                    t = sorted(times[mode])[len(times[mode]) // 2]
                    line += f" | {mode} {t:7.1f} ({t / cublas - 1:+.1%})"
                    rec[mode] = dict(time_us=t, rounds=times[mode], dp_tiles=sched.dp_tiles,
                                     tiles=tiles, split=sched.split)
                    line += f" [split {sched.split}]" if sched.split else ""
                records.append(rec)
                print(line + f"  [tiles {tiles}, waves {tiles / sched.programs:.2f}]",
                      flush=True)
                Path(out_dir).mkdir(parents=True, exist_ok=True)
                (Path(out_dir) / "gemm-split-tail.json").write_text(json.dumps(dict(
                    device=torch.cuda.get_device_name(dev), torch=torch.__version__,
                    triton=triton.__version__, records=records), indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--what", choices=("tail", "forms"), default="tail")
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=dev))
    if args.what == "tail":
        return split_tail(args.out, dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    records = []
    for name, m, k, n in SHAPES:
        g = torch.Generator(device=dev).manual_seed(3)
        a = torch.randn(m, k, device=dev, generator=g).bfloat16()
        b = (torch.randn(k, n, device=dev, generator=g) / k**0.5).bfloat16()
        ref = a @ b
        cublas = time_us(lambda: a @ b)
        records.append(dict(shape=name, m=m, k=k, n=n, variant="cublas", tile="", time_us=cublas))
        print(f"{name:7} M={m:5d} cuBLAS {cublas:8.1f} us", flush=True)
        for vname, flags, tile in RUNS:
            t0 = time.time()
            try:
                fn = run_variant(a, b, tile, flags, sms)
                err = (fn().float() - ref.float()).abs().max().item()
                if not err <= 2e-2 * max(1.0, ref.float().abs().max().item()):
                    raise AssertionError(f"wrong result, max error {err:.3g}")
                t = time_us(fn)
                note = f"{t:8.1f} us ({t / cublas - 1:+.1%} vs cuBLAS)"
            except Exception as e:  # report and go on (e.g. out of shared memory)
                t = float("nan")
                note = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            records.append(dict(shape=name, m=m, k=k, n=n, variant=vname, tile=tile,
                                time_us=t))
            print(f"    {vname:11} {tile:15} {note}  [{time.time() - t0:.0f} s]", flush=True)
            save(args.out, dev, records)  # after every run: a time limit keeps what ran


if __name__ == "__main__":
    main()
