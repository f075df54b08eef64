"""Eager per-call cost of a small all-reduce: commlab vs NCCL vs torch symm-mem, 8 B-1 MiB.

Each implementation runs ``ITERS`` back-to-back eager calls on bf16 tensors (the same
mode for all: no CUDA graph); the figure is wall time per call after a final
synchronize, so it is host cost and device time, whichever is larger. Runs on 1 GPU or 2:

    torchrun --nproc-per-node 1 bench/checks/gpu_eager_cost.py
    torchrun --nproc-per-node 2 bench/checks/gpu_eager_cost.py

Target (issue 19 item 3): commlab at or below torch symm-mem's one_shot at every size.
``commlab`` rows run ahead of the agreement (a repeated call does not wait for the other
ranks' hosts); ``commlab:waiting`` rows are the same calls with that off (what
``COMMLAB_AGREE_AHEAD=0`` gives), and ``waits`` is the share of calls that waited.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import commlab

ITERS = 2000
SIZES = [8 << (3 * i) for i in range(7)] + [1 << 20]  # 8 B, 64 B, ... 2 MiB cut at 1 MiB


def per_call_us(fn, iters: int = ITERS) -> float:
    """Wall time per call of ``iters`` back-to-back calls, after 20 warm-up calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    comm = commlab.init(backend="cuda")
    dev, group = comm.device, dist.group.WORLD.group_name
    sizes = sorted({s for s in SIZES if s <= (1 << 20)})
    rows = []
    for nbytes in sizes:
        n = max(1, nbytes // 2)
        x = torch.ones(n, device=dev, dtype=torch.bfloat16)
        impls = {"commlab": lambda: commlab.all_reduce(x),
                 "commlab:one_shot": lambda: commlab.all_reduce(x, algorithm="one_shot"),
                 "commlab:waiting": lambda: commlab.all_reduce(x),
                 "nccl": lambda: dist.all_reduce(x)}
        try:
            import torch.distributed._symmetric_memory as symm_mem
            t = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
            symm_mem.rendezvous(t, group)
            t.fill_(1)
            impls["symm_mem:one_shot"] = (
                lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group))
        except Exception as e:  # e.g. a world of 1 on a torch without it
            if comm.rank == 0:
                print(f"symm_mem unavailable at {nbytes} B: {e!r:.200}")
        for name, fn in impls.items():
            comm.control.ahead.enabled = name != "commlab:waiting"
            waits = comm.control.waits
            us = per_call_us(fn)
            share = (comm.control.waits - waits) / (ITERS + 20) if name.startswith("commlab") else None
            rows.append((nbytes, name, us, share))
        comm.control.ahead.enabled = True
        comm.synchronize()  # every call that ran ahead is checked
    if comm.rank == 0:
        print(f"world {comm.world_size}, torch {torch.__version__}, {ITERS} eager calls each")
        print(f"{'bytes':>9} {'impl':<20} {'us/call':>9} {'waits':>6}")
        for nbytes, name, us, share in rows:
            shown = f"{share:6.3f}" if share is not None else "     -"
            print(f"{nbytes:>9} {name:<20} {us:>9.2f} {shown}")
    commlab.finalize()


if __name__ == "__main__":
    main()
