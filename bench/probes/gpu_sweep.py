"""Bandwidth sweep for the push collectives, against NCCL and the link's own ceiling.

    torchrun --nproc-per-node 2 bench/probes/gpu_sweep.py

The ceiling: every rank pushes N bytes into its peer with the same launch shape and no
reduction or copy-out (a kernel doing only the stores), which bounds what any SM-driven
push algorithm can reach on these links. Earlier results: bench/results/2xh200-*.txt.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from gpu_link_ceiling import move_kernel  # noqa: E402 (bench/probes/: the push-only kernel)

import commlab  # noqa: E402
from commlab.bench import time_back_to_back  # noqa: E402
from commlab.collectives import _common  # noqa: E402


def main():
    comm = commlab.init(backend="cuda")
    r, w, dev = comm.rank, comm.world_size, comm.device
    rows = []
    for nbytes in (16 << 20, 256 << 20, 1 << 30):
        iters = 10 if nbytes > (64 << 20) else 30
        n = nbytes // 2
        x = torch.randn(n, device=dev).to(torch.bfloat16)
        ref = x.float()
        dist.all_reduce(ref)
        y = x.clone()
        rows.append((nbytes, "all_reduce", "nccl", time_back_to_back(lambda: dist.all_reduce(y), iters)))
        out = commlab.all_reduce(x, algorithm="two_shot")
        ok = torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)
        rows.append((nbytes, "all_reduce", "two_shot" + ("" if ok else " WRONG"),
                     time_back_to_back(lambda: commlab.all_reduce(x, algorithm="two_shot"), iters)))
        half = x[: n // w]
        parts = [torch.empty_like(half) for _ in range(w)]
        ok = torch.equal(commlab.all_gather(half), (dist.all_gather(parts, half), torch.cat(parts))[1])
        rows.append((nbytes, "all_gather", "nccl", time_back_to_back(lambda: dist.all_gather_into_tensor(torch.empty(n, device=dev, dtype=x.dtype), half), iters)))
        rows.append((nbytes, "all_gather", "direct" + ("" if ok else " WRONG"), time_back_to_back(lambda: commlab.all_gather(half), iters)))
        rs_ref = ref[r * (n // w):(r + 1) * (n // w)]
        ok = torch.allclose(commlab.reduce_scatter(x).float(), rs_ref, rtol=2e-2, atol=2e-2)
        rows.append((nbytes, "reduce_scatter", "nccl", time_back_to_back(lambda: dist.reduce_scatter_tensor(torch.empty(n // w, device=dev, dtype=x.dtype), x), iters)))
        rows.append((nbytes, "reduce_scatter", "direct" + ("" if ok else " WRONG"), time_back_to_back(lambda: commlab.reduce_scatter(x), iters)))
        # ceiling: push N/2 bytes per rank per phase, as the collectives do per direction
        scratch = comm.scratch(nbytes // 2, torch.bfloat16)
        cfg = _common.launch_for(comm, n // 2)
        rows.append((nbytes, "push only", f"N/2, {cfg.programs}x{cfg.block}",
                     time_back_to_back(lambda: move_kernel[(cfg.programs,)](x, scratch, x, comm.context, n // 2, ACTIVE_ALL=True, PULL=False, BLOCK=cfg.block, num_warps=cfg.num_warps), iters)))
    if r == 0:
        print(f"{'bytes':>11} {'op':<15} {'impl':<22} {'us':>9} {'GB/s per direction':>19}")
        for nbytes, op, name, t in rows:
            per_dir = (nbytes / 2) / t / 1e3  # W=2: each direction carries N/2 per phase
            phases = 2 if op == "all_reduce" else 1
            print(f"{nbytes:>11} {op:<15} {name:<22} {t:>9.1f} {per_dir * phases:>19.1f}")
        print("GB/s per direction = bytes each rank sends / time; all_reduce busbw equals it "
              "for W=2; all_gather/reduce_scatter busbw equals it with total size N.")
    commlab.finalize()


if __name__ == "__main__":
    main()
