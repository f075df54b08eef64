"""Launch-shape sweep for the push all-reduces, and a profile of the eager host path.

    torchrun --nproc-per-node 2 bench/gpu_sweep.py
Results of the first run are in bench/results/2xh200-launch-sweep.txt.
Each configuration runs in a fresh process group? No: one process, configurations
switched by re-reading the module-level launch shape between runs.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import commlab  # noqa: E402
from commlab.collectives import _common  # noqa: E402


def timeit(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / iters


def main():
    comm = commlab.init(backend="cuda")
    r = comm.rank
    dev = comm.device
    # --- eager host profile (rank 0)
    x = torch.randn(4, device=dev).to(torch.bfloat16)
    for _ in range(50):
        commlab.all_reduce(x, algorithm="one_shot")
    torch.cuda.synchronize()
    dist.barrier()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        commlab.all_reduce(x, algorithm="one_shot")
    prof.disable()
    torch.cuda.synchronize()
    if r == 0:
        st = io.StringIO()
        pstats.Stats(prof, stream=st).sort_stats("tottime").print_stats(14)
        print(st.getvalue()[-3500:])
    # --- launch-shape sweep at large sizes
    rows = []
    for nbytes in (16 << 20, 256 << 20, 1 << 30):
        n = nbytes // 2
        x = torch.randn(n, device=dev).to(torch.bfloat16)
        ref = x.float()
        dist.all_reduce(ref)
        ref = ref.to(torch.bfloat16)
        y = torch.empty_like(x)
        dist.all_reduce(y.copy_(x))
        rows.append((nbytes, "nccl", 0, 0, 0, timeit(lambda: dist.all_reduce(y), 10 if nbytes > (64 << 20) else 30)))
        for block, warps, progs in ((2048, 8, 132), (2048, 8, 256), (4096, 8, 132), (4096, 16, 132), (8192, 16, 132), (8192, 16, 256), (4096, 8, 256)):
            _common._GPU_BLOCK = _common._GPU_BLOCK_BIG = block
            _common._GPU_WARPS = _common._GPU_WARPS_BIG = warps
            _common._GPU_PROGRAMS = progs
            for algo in ("one_shot", "two_shot"):
                out = commlab.all_reduce(x, algorithm=algo)
                ok = torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
                t = timeit(lambda: commlab.all_reduce(x, algorithm=algo), 10 if nbytes > (64 << 20) else 30)
                rows.append((nbytes, algo + ("" if ok else " WRONG"), block, warps, progs, t))
    if r == 0:
        print(f"{'bytes':>11} {'impl':<16} {'block':>6} {'warps':>5} {'progs':>5} {'us':>9} {'busbw':>7}")
        for nbytes, name, b, w_, p, t in rows:
            print(f"{nbytes:>11} {name:<16} {b:>6} {w_:>5} {p:>5} {t:>9.1f} {nbytes / t / 1e3:>7.1f}")
    commlab.finalize()


if __name__ == "__main__":
    main()
