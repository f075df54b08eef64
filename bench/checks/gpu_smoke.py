"""First GPU check: correctness against NCCL for every op x algorithm x dtype, the device
language in compiled Triton, heap lifetimes; then a quick eager timing table.

    torchrun --nproc-per-node 2 bench/checks/gpu_smoke.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import commlab  # noqa: E402
import commlab.language as cl  # noqa: E402
from commlab.bench import time_back_to_back  # noqa: E402


@triton.jit
def ping_kernel(buf_ptr, flag_ptr, ctx, N, BLOCK: tl.constexpr):
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    peer = (me + 1) % world
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    # write our rank into the right neighbour's buffer, then tell it
    tl.store(cl.symm_at(buf_ptr + offs, peer, ctx), tl.full((BLOCK,), 0, tl.float32) + me + 1.0, mask=mask)
    cl.notify(flag_ptr, peer, ctx, 1, sig_op="add")
    cl.wait(flag_ptr, 1)
    cl.barrier(ctx)


MOVE = ("direct", "copy_engine")  # the algorithms of all_gather, broadcast, all_to_all


def check(comm):
    r, w = comm.rank, comm.world_size
    dev = comm.device
    g = torch.Generator(device=dev).manual_seed(1234 + r)
    torch.cuda.synchronize() if comm.backend == "cuda" else None
    fails = 0
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        for n in (1, 7, 1037, 1 << 20):
            x = (torch.randn(n, device=dev, generator=g) * 8).to(dt)
            for op in ("sum", "max", "min"):
                rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
                ref = x.float().clone() if dt.is_floating_point else x.clone()
                dist.all_reduce(ref, op=rop)
                ref = ref.to(dt)
                for algo in ("one_shot", "two_shot", "ring"):
                    y = commlab.all_reduce(x, op=op, algorithm=algo)
                    tol = {} if dt in (torch.float32, torch.int32) else dict(rtol=2e-2, atol=2e-2)
                    try:
                        torch.testing.assert_close(y, ref, **tol)
                    except AssertionError as e:
                        fails += 1
                        print(f"[rank {r}] FAIL all_reduce {algo} {op} {dt} n={n}: {str(e)[:200]}")
            xs = x[: (n // w) * w] if n >= w else x.repeat(w)
            parts = [torch.empty_like(xs) for _ in range(w)]
            dist.all_gather(parts, xs)
            for algo in MOVE:
                if not torch.equal(commlab.all_gather(xs, algorithm=algo), torch.cat(parts)):
                    fails += 1
                    print(f"[rank {r}] FAIL all_gather {algo} {dt} n={n}")
            rs = commlab.reduce_scatter(xs, op="sum")
            full = xs.float().clone() if dt.is_floating_point else xs.clone()
            dist.all_reduce(full)
            c = xs.numel() // w
            torch.testing.assert_close(rs, full[r * c:(r + 1) * c].to(dt), rtol=2e-2, atol=2e-2)
            for algo in MOVE:
                for src in range(w):
                    b = commlab.broadcast(xs, src=src, algorithm=algo)
                    ref = xs.clone()
                    dist.broadcast(ref, src)
                    if not torch.equal(b, ref):
                        fails += 1
                        print(f"[rank {r}] FAIL broadcast {algo} {dt} n={n} src={src}")
                a2a = commlab.all_to_all(xs, algorithm=algo)
                ref = torch.empty_like(xs)
                dist.all_to_all_single(ref, xs)
                if not torch.equal(a2a, ref):
                    fails += 1
                    print(f"[rank {r}] FAIL all_to_all {algo} {dt} n={n}")
    commlab.barrier()
    # device language: notify/wait/symm_at/barrier in compiled Triton
    buf = commlab.symmetric_zeros((100,), torch.float32)
    flag = commlab.symmetric_zeros((1,), torch.int32)
    ping_kernel[(1,)](buf, flag, comm.context, 100, BLOCK=128)
    comm.synchronize()
    left = (r - 1) % w
    if not bool((buf == left + 1).all()):
        fails += 1
        print(f"[rank {r}] FAIL ping {buf[:4].tolist()}")
    # heap lifetime: a view keeps the block; dropping it frees
    before = comm.heap.arena.free_bytes
    t = commlab.symmetric_empty((1 << 20,), torch.float32)
    v = t[10:]
    del t
    mid = comm.heap.arena.free_bytes
    del v
    after = comm.heap.arena.free_bytes
    if not (mid < before and after == before):
        fails += 1
        print(f"[rank {r}] FAIL heap lifetime {before} {mid} {after}")
    # 200 back-to-back calls of varying size, checked at the end
    acc = []
    for i in range(200):
        n = 1 + (i * 7919) % 300000
        x = torch.full((n,), float(r + i % 3), device=dev)
        acc.append((commlab.all_reduce(x), n, i))
    for y, n, i in acc:
        exp = sum(float(q + i % 3) for q in range(w))
        if not bool((y == exp).all()):
            fails += 1
            print(f"[rank {r}] FAIL back-to-back {i} n={n}")
    return fails


def bench(comm):
    r, w = comm.rank, comm.world_size
    dev = comm.device
    import torch.distributed._symmetric_memory as symm_mem
    rows = []
    for nbytes in (8, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30):
        n = max(1, nbytes // 2)
        x = torch.randn(n, device=dev).to(torch.bfloat16)
        iters = 50 if nbytes <= (16 << 20) else 10
        impls = {"nccl": lambda: dist.all_reduce(x.clone())}
        for algo in ("one_shot", "two_shot", "ring"):
            if algo == "one_shot" and nbytes > (16 << 20):
                continue
            impls[f"commlab:{algo}"] = (lambda a=algo: commlab.all_reduce(x, algorithm=a))
        try:
            t = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
            symm_mem.rendezvous(t, dist.group.WORLD.group_name)
            t.copy_(x)
            impls["torch_symm_mem:two_shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", dist.group.WORLD.group_name)
            if nbytes <= (16 << 20):
                impls["torch_symm_mem:one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", dist.group.WORLD.group_name)
        except Exception as e:
            if r == 0:
                print("symm_mem unavailable:", e)
        for name, fn in impls.items():
            us = time_back_to_back(fn, iters, warmup=3)
            rows.append((nbytes, name, us, nbytes / us / 1e3))
    # graph mode at small sizes: 20 calls per graph, time replays
    for nbytes in (8, 64 << 10, 1 << 20):
        n = max(1, nbytes // 2)
        x = torch.randn(n, device=dev).to(torch.bfloat16)
        t = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(t, dist.group.WORLD.group_name)
        gimpls = {"nccl": lambda: dist.all_reduce(x),
                  "commlab:one_shot": lambda: commlab.all_reduce(x, algorithm="one_shot"),
                  "commlab:two_shot": lambda: commlab.all_reduce(x, algorithm="two_shot"),
                  "torch_symm_mem:two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", dist.group.WORLD.group_name)}
        for name, fn in gimpls.items():
            try:
                s_ = torch.cuda.Stream()
                s_.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s_):
                    for _ in range(3):
                        fn()
                torch.cuda.current_stream().wait_stream(s_)
                torch.cuda.synchronize()
                dist.barrier()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(20):
                        fn()
                torch.cuda.synchronize()
                dist.barrier()
                g.replay()
                torch.cuda.synchronize()
                dist.barrier()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(10):
                    g.replay()
                e.record()
                torch.cuda.synchronize()
                us = s.elapsed_time(e) * 1e3 / 200
                rows.append((nbytes, name + " [graph]", us, nbytes / us / 1e3))
            except Exception as ex:
                if r == 0:
                    print("graph failed", name, repr(ex)[:300])
    # host overhead pieces, eager
    from commlab.runtime._control import Signature
    sig = Signature("probe", {"shape": (8,), "dtype": "bfloat16"})
    torch.cuda.synchronize(); dist.barrier()
    t0 = time.perf_counter()
    for _ in range(1000):
        comm.control.agree(sig)
    t_agree = (time.perf_counter() - t0) * 1e3
    x = torch.randn(4, device=dev).to(torch.bfloat16)
    torch.cuda.synchronize(); dist.barrier()
    t0 = time.perf_counter()
    for _ in range(1000):
        commlab.all_reduce(x, algorithm="one_shot")
    t_full = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    if r == 0:
        print(f"host: agree {t_agree:.1f} us/call, full one_shot all_reduce {t_full:.1f} us/call (host loop)")
    if r == 0:
        print(f"{'bytes':>12} {'impl':<26} {'us':>10} {'busbw GB/s':>10}")
        for nbytes, name, us, bw in rows:
            print(f"{nbytes:>12} {name:<26} {us:>10.1f} {bw * 2 * (w - 1) / w:>10.1f}")


def main():
    t0 = time.time()
    comm = commlab.init(backend=os.environ.get("SMOKE_BACKEND", "cuda"))
    if comm.rank == 0:
        print("torch", torch.__version__, "triton", triton.__version__, comm)
    fails = check(comm)
    tot = torch.tensor([fails], device=comm.device)
    dist.all_reduce(tot)
    if comm.rank == 0:
        print(f"correctness failures: {int(tot)}  ({time.time() - t0:.1f} s)")
    if comm.backend == "cuda":
        bench(comm)
    commlab.finalize()
    return int(tot)


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
