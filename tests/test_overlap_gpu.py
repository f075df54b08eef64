"""ag_gemm and gemm_rs compiled on two GPUs, against NCCL + torch.matmul (run on the
2xH200 machine: ``pytest -m gpu tests/test_overlap_gpu.py``)."""

from __future__ import annotations

import secrets
import time

import pytest
import torch

pytestmark = pytest.mark.gpu

# (rows per rank, K, N): the TMA fast path (16-byte rows, tile multiples and not), and
# the pointer path (K * 2 bytes not a multiple of 16). 1000x1000x3000 splits ag_gemm's
# last wave along K, 200x1001x700 both ops' (fewer tiles than SMs). fp16 runs the first
# two (every shape compiles kernel variants of its own: most of this test's time).
SHAPES = [(1024, 4096, 14336), (1000, 1000, 3000), (130, 200, 300), (77, 37, 99),
          (200, 1001, 700)]
FP16_SHAPES = SHAPES[:2]
ULPS = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def gpu_overlap_world(comm, seed):
    import torch.distributed as dist

    import commlab

    g = torch.Generator(device=comm.device).manual_seed(seed + comm.rank)
    w, dev = comm.world_size, comm.device
    failures = []

    def close(label, got, ref):
        scale = ULPS[got.dtype] * max(1.0, ref.abs().max().item())
        err = (got.float() - ref).abs().max().item()
        if got.shape != ref.shape or not err <= scale:
            failures.append(f"rank {comm.rank} {label}: max err {err:.4g} > {scale:.4g}")

    t0 = time.monotonic()
    for dtype in (torch.bfloat16, torch.float16):
        for rows, k, n in SHAPES if dtype == torch.bfloat16 else FP16_SHAPES:
            if comm.rank == 0:  # progress (pytest -s shows it): compiles take most of it
                print(f"[{time.monotonic() - t0:5.0f} s] {dtype} {rows}x{k}x{n}", flush=True)
            for transposed in (False, True):
                label = f"{dtype} rows={rows} k={k} n={n} b^T={transposed}"
                for _ in range(3):  # both buffer parities, epochs > 1
                    a = torch.randn(rows, k, device=dev, generator=g).to(dtype)
                    b = torch.randn(n, k, device=dev, generator=g).to(dtype).t() if transposed \
                        else torch.randn(k, n, device=dev, generator=g).to(dtype)
                    full = torch.empty(rows * w, k, device=dev, dtype=dtype)
                    dist.all_gather_into_tensor(full, a, group=comm.group)
                    for algo in ("fused", "sequential"):
                        got = commlab.ag_gemm(a, b, algorithm=algo)
                        close(f"ag_gemm {algo} " + label, got, full.float() @ b.float())

                    a = torch.randn(rows * w, k, device=dev, generator=g).to(dtype)
                    ref = torch.empty(rows, n, device=dev)
                    dist.reduce_scatter_tensor(ref, (a.float() @ b.float()).to(dtype).float(),
                                               group=comm.group)
                    for algo in ("fused", "sequential"):
                        got = commlab.gemm_rs(a, b, algorithm=algo)
                        close(f"gemm_rs {algo} " + label, got, ref)
    # the tile timeline on GPU: SM lanes, every role present
    a = torch.randn(512, 256, device=dev, generator=g).bfloat16()
    b = torch.randn(256, 512, device=dev, generator=g).bfloat16()
    commlab.trace.start()
    commlab.ag_gemm(a, b, algorithm="fused")
    commlab.gemm_rs(torch.cat([a] * w), b, algorithm="fused")
    spans = commlab.trace.stop()
    tiles = [s for s in spans if "tile" in s.meta]
    kinds = {s.kind for s in tiles}
    if not {"wait", "compute", "reduce"} <= kinds or not all(
            s.lane.startswith("sm ") for s in tiles):
        failures.append(f"rank {comm.rank} trace: kinds {kinds}, lanes "
                        f"{sorted({s.lane for s in tiles})[:5]}")
    pushes = {s.name for s in spans if s.kind == "copy" and s.lane == "copy engine"}
    if pushes != {"ag_gemm:push", "gemm_rs:push"}:
        failures.append(f"rank {comm.rank} trace: copy-engine spans {pushes}")
    # algorithm="auto" inside a CUDA-graph capture runs the replayable sequential path
    a2 = torch.randn(2048, 512, device=dev, generator=g).bfloat16()
    b2 = torch.randn(512, 384, device=dev, generator=g).bfloat16()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        commlab.gemm_rs(a2, b2)
        commlab.ag_gemm(a2[:1024], b2)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_rs = commlab.gemm_rs(a2, b2)
        y_ag = commlab.ag_gemm(a2[:1024], b2)
    a2.copy_(torch.randn(2048, 512, device=dev, generator=g))
    graph.replay()
    ref = torch.empty(2048 // w, 384, device=dev)
    dist.reduce_scatter_tensor(ref, (a2.float() @ b2.float()).bfloat16().float(),
                               group=comm.group)
    close("gemm_rs auto in a CUDA graph", y_rs, ref)
    full = torch.empty(1024 * w, 512, device=dev, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(full, a2[:1024].contiguous(), group=comm.group)
    close("ag_gemm auto in a CUDA graph", y_ag, full.float() @ b2.float())
    # the Triton GEMM alone (the benchmark's "triton_gemm_only"), both B layouts
    from commlab.overlap import matmul

    for rows, k, n in SHAPES:
        a = torch.randn(rows, k, device=dev, generator=g).bfloat16()
        b = torch.randn(k, n, device=dev, generator=g).bfloat16()
        close(f"triton gemm {rows}x{k}x{n}", matmul(comm, a, b), a.float() @ b.float())
        close(f"triton gemm {rows}x{k}x{n} b^T", matmul(comm, a, b.t().contiguous().t()),
              a.float() @ b.float())
    return failures


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_fused_overlap_matches_nccl_and_matmul_on_two_gpus():
    from commlab.testing import run_world

    results = run_world(gpu_overlap_world, 2, args=(secrets.randbelow(1 << 30),),
                        backend="cuda", timeout=420)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:10])
