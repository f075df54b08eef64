"""Rank functions for tests/test_torch_backend.py: torch.distributed on "commlab"
against the same work on gloo, in the same world.

Each world starts torch.distributed itself (``run_world(..., init=False)``), as a script
under torchrun does: the default group is "commlab", and a gloo group of the same ranks
is the reference.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import commlab
from tests.worlds._checks import Checks

R = dist.ReduceOp


def start() -> tuple[int, int, object]:
    """``init_process_group("commlab")`` from the environment, plus a gloo reference."""
    dist.init_process_group("commlab")
    return dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo")


def _gen(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1000 + rank)


def _data(gen, n: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n,), generator=gen).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=gen).to(dtype)


def _close(a, b, dtype):
    if dtype.is_floating_point:
        tol = {torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
    else:
        assert torch.equal(a, b), f"{a} != {b}"


REDUCE_DTYPES = (torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.float64)
MOVE_DTYPES = (torch.float32, torch.float16, torch.int64, torch.float64, torch.uint8,
               torch.bool, torch.int16, torch.complex64)


def collectives_world(comm, seed: int) -> dict:
    """Every dist op through the "commlab" group against gloo."""
    rank, W, gloo = start()
    ck = Checks(rank)
    gen = _gen(seed, rank)

    for dtype in REDUCE_DTYPES:
        for op in ("sum", "avg", "max", "min", "product"):
            n = 1037 if dtype != torch.int64 else 7
            with ck.case("all_reduce", f"{op} {dtype}"):
                x = _data(gen, n, dtype)
                if op == "product":
                    x = (x.abs() % 3 + 1).to(dtype) if not dtype.is_floating_point \
                        else x.clamp(-1.5, 1.5)
                ref = x.clone()
                dist.all_reduce(ref, op=R.SUM if op == "avg" else getattr(R, op.upper()),
                                group=gloo)
                if op == "avg":
                    ref = ref / W if dtype.is_floating_point else torch.div(
                        ref, W, rounding_mode="trunc").to(dtype)
                got = x.clone()
                dist.all_reduce(got, op=getattr(R, op.upper()))
                _close(got, ref, dtype)

    for dtype in MOVE_DTYPES:
        n = 13 if dtype in (torch.uint8, torch.bool, torch.int16) else 1037
        ref_dtype = torch.int32 if dtype == torch.int16 else dtype  # gloo has no int16
        with ck.case("all_gather_into_tensor", str(dtype)):
            x = _data(gen, n, dtype) if dtype != torch.complex64 else \
                torch.randn(n, dtype=dtype, generator=gen)
            ref = torch.empty(W * n, dtype=ref_dtype)
            dist.all_gather_into_tensor(ref, x.to(ref_dtype), group=gloo)
            ref = ref.to(dtype)
            got = torch.empty(W * n, dtype=dtype)
            dist.all_gather_into_tensor(got, x)
            assert torch.equal(got, ref)
        with ck.case("all_gather", str(dtype)):
            got = [torch.empty_like(x) for _ in range(W)]
            dist.all_gather(got, x)
            assert all(torch.equal(g, r) for g, r in zip(got, ref.chunk(W), strict=True))
        with ck.case("broadcast", str(dtype)):
            for src in range(W):
                y = x.clone()
                ref_b = x.to(ref_dtype)
                dist.broadcast(ref_b, src=src, group=gloo)
                dist.broadcast(y, src=src)
                assert torch.equal(y, ref_b.to(dtype)), f"src {src}"
        with ck.case("all_to_all_single", f"even {dtype}"):
            xs = x[: n // W * W]
            ref = torch.empty_like(xs, dtype=ref_dtype)
            dist.all_to_all_single(ref, xs.to(ref_dtype), group=gloo)
            got = torch.empty_like(xs)
            dist.all_to_all_single(got, xs)
            assert torch.equal(got, ref.to(dtype))

    with ck.case("all_to_all_single", "uneven splits (fallback)"):
        ins = [r + 1 for r in range(W)]  # rank r sends r+1 elements... to each peer j: j+1
        x = torch.arange(sum(ins), dtype=torch.float32) + 100 * rank
        outs = [rank + 1] * W
        got = torch.empty(sum(outs))
        ref = torch.empty(sum(outs))
        dist.all_to_all_single(got, x, outs, ins)
        dist.all_to_all_single(ref, x, outs, ins, group=gloo)
        assert torch.equal(got, ref)

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.int64):
        for op in ("sum", "avg", "max"):
            with ck.case("reduce_scatter_tensor", f"{op} {dtype}"):
                x = _data(gen, W * 301, dtype)
                full = x.clone()
                dist.all_reduce(full, op=R.MAX if op == "max" else R.SUM, group=gloo)
                ref = full.chunk(W)[rank]
                if op == "avg":
                    ref = ref / W if dtype.is_floating_point else torch.div(
                        ref, W, rounding_mode="trunc").to(dtype)
                got = torch.empty(301, dtype=dtype)
                dist.reduce_scatter_tensor(got, x, op=getattr(R, op.upper()))
                _close(got, ref, dtype)
                with ck.case("reduce_scatter", f"{op} {dtype}"):
                    got = torch.empty(301, dtype=dtype)
                    dist.reduce_scatter(got, list(x.chunk(W)), op=getattr(R, op.upper()))
                    _close(got, ref, dtype)

    with ck.case("coalesced", "all_reduce_coalesced and the coalescing manager"):
        xs = [_data(gen, n, torch.float32) for n in (5, 17, 3)]
        refs = [x.clone() for x in xs]
        for r in refs:
            dist.all_reduce(r, group=gloo)
        got = [x.clone() for x in xs]
        dist.all_reduce_coalesced(got)
        for g, r in zip(got, refs, strict=True):
            _close(g, r, torch.float32)
        from torch.distributed.distributed_c10d import _coalescing_manager

        got = [x.clone() for x in xs]
        with _coalescing_manager(async_ops=True) as cm:
            for g in got:
                dist.all_reduce(g)
        cm.wait()
        for g, r in zip(got, refs, strict=True):
            _close(g, r, torch.float32)

    with ck.case("async", "async_op=True: wait() and get_future()"):
        x = _data(gen, 100, torch.float32)
        ref = x.clone()
        dist.all_reduce(ref, group=gloo)
        got = x.clone()
        work = dist.all_reduce(got, async_op=True)
        assert work.wait() is True
        _close(got, ref, torch.float32)
        got = x.clone()
        fut = dist.all_reduce(got, async_op=True).get_future()
        out = fut.then(lambda f: f.value()[0] * 2).wait()
        _close(out, ref * 2, torch.float32)

    with ck.case("barrier", "barrier"):
        dist.barrier()

    with ck.case("fallback", "send/recv (fallback); gather, scatter, reduce, objects"):
        if W >= 2:
            t = torch.full((4,), float(rank))
            if rank == 0:
                dist.send(t + 10, dst=1)
            elif rank == 1:
                dist.recv(t, src=0)
                assert torch.equal(t, torch.full((4,), 10.0))
        g = [torch.empty(3) for _ in range(W)] if rank == 0 else None
        dist.gather(torch.full((3,), float(rank)), g, dst=0)
        if rank == 0:
            assert [int(v[0]) for v in g] == list(range(W))
        s = torch.empty(2)
        dist.scatter(s, [torch.full((2,), float(r)) for r in range(W)] if rank == 0 else None,
                     src=0)
        assert torch.equal(s, torch.full((2,), float(rank)))
        t = torch.ones(3)
        dist.reduce(t, dst=0)
        want = float(W) if rank == 0 else 1.0  # the other ranks' tensors stay as they were
        assert torch.equal(t, torch.full((3,), want)), t
        objs = [None] * W
        dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
        assert objs == [{"rank": r, "s": "x" * r} for r in range(W)]
        box = [{"k": rank}]
        dist.broadcast_object_list(box, src=W - 1)
        assert box == [{"k": W - 1}]

    with ck.case("groups", "new_group of the world and of a subset"):
        whole = dist.new_group(list(range(W)), backend="commlab")
        sub = dist.new_group([0, 1], backend="commlab")
        assert whole.spans_world and whole.communicator() is commlab.init()
        t = torch.ones(5) * (rank + 1)
        dist.all_reduce(t, group=whole)
        assert torch.equal(t, torch.full((5,), W * (W + 1) / 2))
        if rank in (0, 1):
            assert sub.spans_world == (W == 2)
            t = torch.ones(5) * (rank + 1)
            dist.all_reduce(t, group=sub)
            assert torch.equal(t, torch.full((5,), 3.0))

    with ck.case("init", "commlab.init() returns the backend's Communicator"):
        c = commlab.init()
        assert c is dist.group.WORLD.communicator()
        assert c is commlab.get_communicator() and c.world_size == W and c.rank == rank
        y = commlab.all_reduce(torch.ones(3))
        assert torch.equal(y, torch.full((3,), float(W)))

    with ck.case("trace", "dist.all_reduce records commlab's comm span"):
        x = torch.ones(256)
        commlab.trace.start()
        dist.all_reduce(x.clone())
        commlab.all_reduce(x)
        spans = commlab.trace.stop()
        comm_spans = [(s.kind, s.name, s.bytes) for s in spans if s.kind == "comm"]
        assert comm_spans == [("comm", "all_reduce", 1024)] * 2, comm_spans

    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return ck.result()


def mismatch_world(comm) -> dict:
    """Sizes and dtypes that differ across ranks raise commlab's error on every rank; the
    world goes on."""
    rank, W, gloo = start()
    out: dict = {"errors": []}
    cases = {
        "shape": lambda: dist.all_reduce(torch.ones(4 + rank)),
        "dtype": lambda: dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank
                                                    else torch.bfloat16)),
        "int64 vs float64": lambda: dist.broadcast(
            torch.ones(4, dtype=torch.int64 if rank else torch.float64), src=0),
        "output size": lambda: dist.all_gather_into_tensor(
            torch.empty(W * 4 + (rank == W - 1)), torch.ones(4)),
    }
    for name, fn in cases.items():
        try:
            fn()
            out["errors"].append((name, None, ""))
        except Exception as e:  # what the test asserts on: the type and message
            out["errors"].append((name, type(e).__name__, str(e)))
    t = torch.ones(8) * (rank + 1)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    dist.destroy_process_group()
    return out


# --- real clients: the same training on "commlab" and on gloo ----------------------------


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8))


def _batch(seed: int, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 7919 + rank * 131 + step)
    return torch.randn(6, 16, generator=g), torch.randn(6, 8, generator=g)


def _train(model, seed: int, rank: int, steps: int, lr: float = 0.05) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = _batch(seed, rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def ddp_world(comm, seed: int, steps: int = 4) -> dict:
    """DDP on "commlab" and on gloo from the same (rank-dependent: DDP broadcasts rank
    0's) initial weights; several buckets, so several bucket all-reduces per step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, W, gloo = start()
    out = {}
    for name, group in (("commlab", dist.group.WORLD), ("gloo", gloo)):
        model = DDP(_mlp(seed + rank), process_group=group, bucket_cap_mb=0.001)
        commlab.trace.start()
        out[name + "_losses"] = _train(model, seed, rank, steps)
        spans = commlab.trace.stop()
        out[name + "_params"] = [p.detach().clone() for p in model.parameters()]
        out[name + "_comm_spans"] = sum(1 for s in spans if s.kind == "comm")
        # Free DDP's Reducer while ``group`` is still referenced here, and let gloo's
        # threads drop their finished works (they take the GIL to do it): a Reducer freed
        # holding a process group's last reference joins those threads with the GIL
        # held, a deadlock inside torch (seen once in ~5 runs on a loaded 2-core machine).
        del model
        time.sleep(0.1)
    dist.destroy_process_group()
    return out


def _one_backend(backend: str, build, seed: int, steps: int, rank_data: bool) -> dict:
    """Train ``build(mesh)`` with torch.distributed's default group on ``backend``.

    One backend per world: DTensor caches sharding decisions by mesh shape, so a second
    mesh of the same ranks in the same process would reuse the first mesh's groups."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(backend)
    rank, W = dist.get_rank(), dist.get_world_size()
    model = build(init_device_mesh("cpu", (W,)), W)
    commlab.trace.start()
    losses = _train(model, seed, rank if rank_data else 0, steps)
    spans = commlab.trace.stop()
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return {"losses": losses, "params": params,
            "comm_spans": sorted({s.name for s in spans if s.kind == "comm"})}


def fsdp_world(comm, seed: int, backend: str, steps: int = 3) -> dict:
    """FSDP2 (``fully_shard`` per layer and the root)."""
    from torch.distributed.fsdp import fully_shard

    def build(mesh, W):
        model = _mlp(seed)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    return _one_backend(backend, build, seed, steps, rank_data=True)


def tp_world(comm, seed: int, backend: str, steps: int = 3) -> dict:
    """A DTensor tensor-parallel MLP (ColwiseParallel, then RowwiseParallel); every rank
    gets the same batch, as tensor parallelism wants."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    def build(mesh, W):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(16, 8 * W), torch.nn.ReLU(),
                                    torch.nn.Linear(8 * W, 8))
        return parallelize_module(model, mesh,
                                  {"0": ColwiseParallel(), "2": RowwiseParallel()})

    return _one_backend(backend, build, seed, steps, rank_data=False)


def compile_world(comm, seed: int, backend: str = "inductor") -> dict:
    """Functional collectives inside ``torch.compile(fullgraph=True)``."""
    import torch.distributed._functional_collectives as fc

    rank, W, gloo = start()
    torch._dynamo.reset()

    def step(x, w, group):
        y = fc.all_reduce(x @ w, "sum", group)
        g = fc.all_gather_tensor(y.relu(), 0, group)
        return fc.reduce_scatter_tensor(g * 2, "sum", 0, group) + 1

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    gen = _gen(seed, rank)
    x, w = torch.randn(4 * W, 8, generator=gen), torch.randn(8, 6, generator=gen)
    commlab.trace.start()
    got = compiled(x, w, dist.group.WORLD)
    spans = commlab.trace.stop()
    ref = step(x, w, gloo)
    out = {"got": got, "ref": ref, "ops": sorted({s.name for s in spans if s.kind == "comm"})}
    dist.destroy_process_group()
    return out


# --- torch.library custom ops -------------------------------------------------------------


def custom_ops_world(comm, seed: int) -> dict:
    """``torch.ops.commlab.ag_gemm`` / ``gemm_rs``: values, gradients (against the same
    math on gloo), fake tensors, and a tensor-parallel MLP under torch.compile."""
    import commlab.torch_backend.ops  # noqa: F401  (registers torch.ops.commlab.*)

    rank, W = comm.rank, comm.world_size
    ck = Checks(rank)
    gen = _gen(seed, rank)
    ops = torch.ops.commlab

    def gather(t):  # gloo reference: every rank's t, concatenated
        parts = [torch.empty_like(t) for _ in range(W)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    rows, K, N = 4, 16, 8
    bf = torch.bfloat16  # the fused GEMMs take bf16/fp16; references in fp32 of the same values

    def rand(*shape, grad=False):
        return torch.randn(*shape, generator=gen).to(bf).requires_grad_(grad)

    def close(x, y):
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=1e-1)

    a, b, g = rand(rows, K, grad=True), rand(K, N, grad=True), rand(W * rows, N)
    with ck.case("ag_gemm", "value and gradients"):
        out = ops.ag_gemm(a, b)
        a_full = gather(a.detach().float())
        close(out, a_full @ b.detach().float())
        out.backward(g)
        # loss = sum_q <all_gather(a) @ b_q, g_q>: grad a_r = sum_q (g_q @ b_q.T)[rows of r]
        bs, gs = gather(b.detach().float().unsqueeze(0)), gather(g.float().unsqueeze(0))
        ref_a = sum(gq @ bq.T for gq, bq in zip(gs, bs, strict=True))[rank * rows:][:rows]
        close(a.grad, ref_a)
        close(b.grad, a_full.T @ g.float())

    a2, b2, g2 = rand(W * rows, K, grad=True), rand(K, N, grad=True), rand(rows, N)
    with ck.case("gemm_rs", "value and gradients"):
        out = ops.gemm_rs(a2, b2)
        total = a2.detach().float() @ b2.detach().float()
        dist.all_reduce(total)
        close(out, total[rank * rows:][:rows])
        out.backward(g2)
        g_full = gather(g2.float())
        close(a2.grad, g_full @ b2.detach().float().T)
        close(b2.grad, a2.detach().float().T @ g_full)

    with ck.case("fake", "opcheck: schema and fake tensors"):
        for op, args in ((ops.ag_gemm.default, (a.detach(), b.detach())),
                         (ops.gemm_rs.default, (a2.detach(), b2.detach()))):
            torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))

    with ck.case("compile", "a TP MLP of ag_gemm and gemm_rs, fullgraph, forward+backward"):
        w1, w2, x = rand(K, 2 * N, grad=True), rand(2 * N, K, grad=True), rand(rows, K)

        def mlp(x, w1, w2):
            return ops.gemm_rs(ops.ag_gemm(x, w1).relu(), w2)

        compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
        y = compiled(x, w1, w2)
        y.float().square().sum().backward()
        grads = (w1.grad.clone(), w2.grad.clone())
        w1.grad = w2.grad = None
        y_ref = mlp(x, w1, w2)  # eager: the same kernels, so the same bits
        y_ref.float().square().sum().backward()
        torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
        torch.testing.assert_close(grads, (w1.grad, w2.grad), rtol=0, atol=0)
    return ck.result()


def env_world(comm) -> dict:
    """A world started by ``commlab.init()`` with ``COMMLAB_TORCH_BACKEND=commlab`` (what
    ``%dist_start`` engines do when the notebook sets it): torch.distributed is on
    "commlab" and shares the Communicator."""
    t = torch.ones(3) * (comm.rank + 1)
    commlab.trace.start()
    dist.all_reduce(t)
    spans = commlab.trace.stop()
    return {"backend": dist.get_backend(), "sum": t.tolist(),
            "spans": [s.name for s in spans if s.kind == "comm"],
            "same": commlab.init() is comm is dist.group.WORLD.communicator()}


# --- commlab.watch ------------------------------------------------------------------------


def watch_world(comm, scenario: str, steps: int = 8, slow_from: int = 5) -> dict:
    """DDP steps under ``commlab.watch()``; from step ``slow_from`` either the last rank
    computes 0.4 s longer ("straggler") or every collective takes 0.2 s longer inside
    its kernel span ("slow_link")."""
    import contextlib
    import time
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    from commlab.topology import Edge, Node, Topology
    from commlab.torch_backend import _into, _native

    rank, W, _ = start()
    topo = Topology("test", nodes=[Node(f"rank{r}", "rank") for r in range(W)],
                    edges=[Edge("rank0", "rank1", "shm", "SHM", measured_gbps=3.5)],
                    ranks={r: f"rank{r}" for r in range(W)})
    model = DDP(_mlp(0), bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = commlab.watch(baseline=3, factor=2.0, topology=topo, verbose=False)
    kernels = (_native.all_reduce, _into.all_reduce_)  # new output / in place (CPU)

    def slowed(kernel):
        def slow_all_reduce(*args, **kwargs):
            with commlab.trace.collective("all_reduce", 0, "slowed", None):
                time.sleep(0.2)  # the link is slow: the kernel takes longer, same bytes
            return kernel(*args, **kwargs)

        return slow_all_reduce

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            slow = step >= slow_from
            if scenario == "slow_link" and slow:
                _native.all_reduce, _into.all_reduce_ = map(slowed, kernels)
            with w.step():
                x, y = _batch(0, rank, step)
                end = time.perf_counter() + 0.04  # 40 ms of steady compute per step, so
                while time.perf_counter() < end:  # the baseline ratio is not noise
                    pass
                if scenario == "straggler" and slow and rank == W - 1:
                    time.sleep(0.4)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            _native.all_reduce, _into.all_reduce_ = kernels
    with contextlib.suppress(Exception):
        w.figure()  # renders (matplotlib, headless)
    dist.destroy_process_group()
    return {"alerts": [(s.step, s.alert) for s in w.history if s.alert],
            "warned": [str(c.message) for c in caught
                       if c.category.__name__ == "CommRatioWarning"],
            "ratios": [s.ratio for s in w.history]}
