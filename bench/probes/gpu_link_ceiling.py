"""What can any algorithm move over one NVLink direction? Launch shapes, push vs pull,
SMs vs copy engines, one direction vs both at once.

    torchrun --nproc-per-node 2 bench/probes/gpu_link_ceiling.py [--out DIR]

Every rank moves S bytes into (push) or out of (pull) its peer's symmetric scratch, both
ranks at once ("bidirectional", what all_gather/reduce_scatter/all_reduce do) or rank 0
alone. SM kernels are timed over back-to-back launches with CUDA events (they end with a
signal/wait round so both ranks finish together); copy-engine copies
(``peer_view.copy_``) likewise. Prints GB/s per direction = S / time, sorted; writes
DIR/link-ceiling-2xh200.txt when --out is given.
"""

from __future__ import annotations

import argparse
import itertools
import os

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import commlab  # noqa: E402
from commlab.bench import time_back_to_back  # noqa: E402
from commlab.collectives import _sync  # noqa: E402
from commlab.collectives._common import peer_ptr  # noqa: E402
from commlab.runtime.peer import peer_view  # noqa: E402


@triton.jit
def move_kernel(x_ptr, scratch_ptr, out_ptr, ctx, N, ACTIVE_ALL: tl.constexpr,
                PULL: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    n = _sync.begin_call(ctx)
    peer = (me + 1) % world
    if ACTIVE_ALL or me == 0:
        if PULL:
            src = peer_ptr(scratch_ptr, peer, ctx)
            for start in range(pid * BLOCK, N, nprog * BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < N
                tl.store(out_ptr + offs, tl.load(src + offs, mask=mask), mask=mask)
        else:
            dst = peer_ptr(scratch_ptr, peer, ctx)
            for start in range(pid * BLOCK, N, nprog * BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < N
                tl.store(dst + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    _sync.signal_all(ctx, n * 64 + 1)
    _sync.wait_all(ctx, n * 64 + 1)
    _sync.end_call(ctx, n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    comm = commlab.init(backend="cuda")
    dev = comm.device
    rows = []

    def sm(nbytes, programs, block, warps, both=True, pull=False):
        n = nbytes // 2
        x = torch.ones(n, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        scratch = comm.scratch(nbytes, torch.bfloat16)
        t = time_back_to_back(lambda: move_kernel[(programs,)](
            x, scratch, out, comm.context, n, ACTIVE_ALL=both, PULL=pull, BLOCK=block,
            num_warps=warps), args.iters, group=comm.cpu_group)
        kind = ("pull" if pull else "push") + (" both" if both else " one")
        rows.append((nbytes, f"SM {kind}", f"{programs} prog x {block} el x {warps} warps", t))
        return t

    def ce(nbytes, both=True):
        n = nbytes // 2
        x = torch.ones(n, device=dev, dtype=torch.bfloat16)
        scratch = comm.scratch(nbytes, torch.bfloat16)
        dst = peer_view(comm, scratch, (comm.rank + 1) % comm.world_size)
        active = both or comm.rank == 0
        copy = (lambda: dst.copy_(x, non_blocking=True)) if active else (lambda: None)
        t = time_back_to_back(copy, args.iters, group=comm.cpu_group)
        rows.append((nbytes, "copy engine " + ("both" if both else "one"), "peer_view.copy_", t))

    S = 256 << 20
    for programs, block, warps in itertools.product((32, 64, 128, 256), (4096, 8192, 16384),
                                                    (8, 16)):
        sm(S, programs, block, warps)
    best = sorted((r for r in rows if r[0] == S), key=lambda r: r[3])[:3]
    for p, b, w in (256, 8192, 16), (132, 8192, 16):
        sm(S, p, b, w, pull=True)
    ce(S)
    ce(S, both=False)
    shapes = [tuple(int(v) for v in r[2].replace(" prog x", "").replace(" el x", "")
                    .replace(" warps", "").split()) for r in best]
    sm(S, *shapes[0], both=False)
    for shape in shapes:
        sm(1 << 30, *shape)
    ce(1 << 30)
    if comm.rank == 0:
        lines = [f"{'bytes/dir':>11} {'mover':<18} {'shape':<34} {'us':>9} {'GB/s/dir':>9}"]
        for nbytes, kind, shape, t in sorted(rows, key=lambda r: (r[0], r[3])):
            lines.append(f"{nbytes:>11} {kind:<18} {shape:<34} {t:>9.1f} "
                         f"{nbytes / t / 1e3:>9.1f}")
        lines.append("GB/s/dir = bytes moved per direction / time (NVLink line rate 478 GB/s)")
        text = "\n".join(lines)
        print(text, flush=True)
        if args.out:
            with open(os.path.join(args.out, "link-ceiling-2xh200.txt"), "w") as f:
                f.write(text + "\n")
    commlab.finalize()


if __name__ == "__main__":
    main()
