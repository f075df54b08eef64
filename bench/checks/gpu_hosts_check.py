"""Worlds across hosts on GPUs: every public collective, hierarchical, against NCCL's flat
result in the same world. Hosts are split on one machine with ``COMMLAB_HOSTS`` (each
"host" gets its own heap, rendezvoused on its own group; NCCL between them):

    COMMLAB_HOSTS=2 torchrun --standalone --nproc-per-node 4 bench/checks/gpu_hosts_check.py

Prints one line per check and exits non-zero on any failure.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import commlab

OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def main() -> int:
    comm = commlab.init("cuda")
    W, me, dev = comm.world_size, comm.rank, comm.device
    gen = torch.Generator(device=dev).manual_seed(1234 + me)
    failures = 0

    def check(label, fn):
        nonlocal failures
        try:
            fn()
            ok = "ok"
        except Exception as e:  # report every check, then fail at the end
            failures += 1
            ok = f"FAIL {type(e).__name__}: {str(e)[:300]}"
        if me == 0:
            print(f"{label:<48} {ok}", flush=True)

    def gathered(x):
        parts = [torch.empty_like(x) for _ in range(W)]
        dist.all_gather(parts, x.contiguous())
        return parts

    def shape():
        assert len(comm.hosts) > 1 and comm.local.world_size == len(comm.hosts[0])
        try:
            _ = comm.context
        except commlab.CommlabUsageError:
            return
        raise AssertionError("comm.context did not raise")

    check(f"hosts {comm.hosts}, comm.local, comm.context refused", shape)
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1037, 600_000):
            x = torch.randn(n, generator=gen, device=dev).to(dtype)
            for op in OPS:
                for algo in ("auto", "one_shot", "two_shot", "ring"):
                    def ar(x=x, op=op, algo=algo):
                        ref = x.float()
                        dist.all_reduce(ref, op=OPS[op])
                        out = commlab.all_reduce(x, op=op, algorithm=algo)
                        tol = 0 if op != "sum" else (2e-2 if dtype == torch.bfloat16 else 1e-5)
                        torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * 4)
                    check(f"all_reduce {dtype} n={n} {op} {algo}", ar)
        x = torch.randn(W * 6, 33, generator=gen, device=dev).to(dtype)
        check(f"all_gather {dtype}", lambda x=x: torch.testing.assert_close(
            commlab.all_gather(x), torch.cat(gathered(x)), rtol=0, atol=0))
        check(f"all_to_all {dtype}", lambda x=x: torch.testing.assert_close(
            commlab.all_to_all(x), torch.cat([p.view(W, 6, 33)[me] for p in gathered(x)]),
            rtol=0, atol=0))
        for src in (0, W - 1):
            check(f"broadcast {dtype} src={src}", lambda x=x, src=src: torch.testing.assert_close(
                commlab.broadcast(x, src=src), gathered(x)[src], rtol=0, atol=0))

        def rs(x=x):
            ref = x.float()
            dist.all_reduce(ref)
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
            torch.testing.assert_close(commlab.reduce_scatter(x).float(),
                                       ref.view(W, 6, 33)[me], rtol=tol, atol=tol * 4)
        check(f"reduce_scatter {dtype}", rs)
    check("barrier", commlab.barrier)
    a = torch.randn(W * 128, 256, generator=gen, device=dev).bfloat16()
    b = torch.randn(256, 128, device=dev, generator=torch.Generator(device=dev).manual_seed(7))
    b = b.bfloat16()
    for algo in ("auto", "fused", "sequential"):
        check(f"ag_gemm {algo}", lambda algo=algo: torch.testing.assert_close(
            commlab.ag_gemm(a, b, algorithm=algo).float(),
            torch.cat(gathered(a)).float() @ b.float(), rtol=2e-2, atol=0.5))

        def grs(algo=algo):
            ref = a.float() @ b.float()
            dist.all_reduce(ref)
            torch.testing.assert_close(commlab.gemm_rs(a, b, algorithm=algo).float(),
                                       ref.view(W, 128, 128)[me], rtol=2e-2, atol=1.0)
        check(f"gemm_rs {algo}", grs)
    torch.cuda.synchronize()
    total = torch.tensor([failures], device=dev)
    dist.all_reduce(total)
    if me == 0:
        print(f"{int(total.item())} failures over all ranks", flush=True)
    commlab.finalize()
    return 1 if total.item() else 0


if __name__ == "__main__":
    sys.exit(main())
