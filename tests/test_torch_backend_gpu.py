"""The "commlab" torch.distributed backend on two GPUs ("cpu:gloo,cuda:commlab"), against
NCCL in the same world (run on the 2xH200 machine: ``pytest -m gpu
tests/test_torch_backend_gpu.py``)."""

from __future__ import annotations

import secrets

import pytest
import torch

pytestmark = pytest.mark.gpu


def gpu_backend_world(comm, seed: int) -> list[str]:
    import os

    import torch.distributed as dist

    import commlab
    from commlab.torch_backend import CommlabProcessGroup
    from tests.worlds.torch_backend import _mlp

    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("cpu:gloo,cuda:commlab")  # no device_id (see the backend README)
    nccl = dist.new_group(backend="nccl")
    rank, W = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(device=dev).manual_seed(seed + rank)
    failures: list[str] = []

    def check(label, fn):
        try:
            fn()
        except Exception as e:  # collected: the test shows every failure at once
            failures.append(f"rank {rank} {label}: {type(e).__name__}: {e}")

    def same(a, b):
        tol = 2e-2 if a.dtype in (torch.bfloat16, torch.float16) else 1e-5
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)

    R = dist.ReduceOp
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (7, 1 << 20):
            x = (torch.randn(n, device=dev, generator=g) * 100).to(dtype)
            for op in (R.SUM, R.MAX, R.MIN) + ((R.AVG,) if dtype.is_floating_point else ()):
                def ar(x=x, op=op):
                    a, b = x.clone(), x.clone()
                    dist.all_reduce(a, op=op)
                    dist.all_reduce(b, op=op, group=nccl)
                    same(a, b)
                check(f"all_reduce {op} {dtype} {n}", ar)

            def ag(x=x):
                a = torch.empty(W * x.numel(), dtype=x.dtype, device=dev)
                b = torch.empty_like(a)
                dist.all_gather_into_tensor(a, x)
                dist.all_gather_into_tensor(b, x, group=nccl)
                assert torch.equal(a, b)
            check(f"all_gather_into_tensor {dtype} {n}", ag)

            def bc(x=x):
                a, b = x.clone(), x.clone()
                dist.broadcast(a, src=W - 1)
                dist.broadcast(b, src=W - 1, group=nccl)
                assert torch.equal(a, b)
            check(f"broadcast {dtype} {n}", bc)

            def rs(x=x):
                full = x.repeat(W)
                a = torch.empty_like(x)
                b = torch.empty_like(x)
                dist.reduce_scatter_tensor(a, full)
                dist.reduce_scatter_tensor(b, full, group=nccl)
                same(a, b)
            check(f"reduce_scatter_tensor {dtype} {n}", rs)

            def a2a(x=x):
                xs = x[: x.numel() // W * W]
                a, b = torch.empty_like(xs), torch.empty_like(xs)
                dist.all_to_all_single(a, xs)
                dist.all_to_all_single(b, xs, group=nccl)
                assert torch.equal(a, b)
            check(f"all_to_all_single {dtype} {n}", a2a)

    def stream_order():
        # async_op on a side stream: wait() orders the caller's later work after it
        x = torch.ones(1 << 22, device=dev)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = x * (rank + 1)
            work = dist.all_reduce(y, async_op=True)
        work.wait()  # on the current stream here: waits for the side stream's kernels
        z = y * 1
        torch.cuda.synchronize()
        assert torch.equal(z, torch.full_like(x, W * (W + 1) / 2))
        fut = dist.all_reduce(torch.ones(8, device=dev), async_op=True).get_future()
        assert torch.equal(fut.wait()[0], torch.full((8,), float(W), device=dev))
    check("async Work and streams", stream_order)

    def cpu_tensor():  # the gloo half of "cpu:gloo,cuda:commlab"
        t = torch.ones(5)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((5,), float(W)))
    check("cpu tensor through gloo", cpu_tensor)

    def init_is_backend():
        c = commlab.init()
        assert isinstance(dist.group.WORLD, CommlabProcessGroup)
        assert c is dist.group.WORLD.communicator() and c.backend == "cuda"
    check("commlab.init() returns the backend's Communicator", init_is_backend)

    def traced():
        commlab.trace.start()
        dist.all_reduce(torch.ones(256, device=dev))
        spans = commlab.trace.stop()
        assert [(s.kind, s.name) for s in spans if s.kind == "comm"] == [("comm", "all_reduce")]
    check("trace span", traced)

    def ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP

        losses = {}
        for name, group in (("commlab", dist.group.WORLD), ("nccl", nccl)):
            model = DDP(_mlp(seed + rank).to(dev), process_group=group, bucket_cap_mb=0.001)
            losses[name] = _train_on(model, seed, rank, dev)
        torch.testing.assert_close(losses["commlab"], losses["nccl"], rtol=1e-4, atol=1e-5)
    check("DDP", ddp)

    dist.destroy_process_group()
    return failures


def _train_on(model, seed, rank, dev):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(4):
        gen = torch.Generator().manual_seed(seed * 7919 + rank * 131 + step)
        x, y = torch.randn(6, 16, generator=gen).to(dev), torch.randn(6, 8, generator=gen).to(dev)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_commlab_backend_matches_nccl_on_two_gpus():
    from commlab.testing import run_world

    results = run_world(gpu_backend_world, 2, args=(secrets.randbelow(1 << 30),),
                        backend="cuda", timeout=600, init=False)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:20])
