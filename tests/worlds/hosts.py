"""Rank functions for tests/test_hosts.py: a world of 2 hosts x 2 ranks, every public
collective against gloo's flat result in the same world.

Runs the same under ``run_world`` with ``COMMLAB_HOSTS=2`` (hosts split on one machine)
and under torchrun on namespace hosts (``python -m tests.worlds.hosts OUT_DIR``: each
rank writes its result to OUT_DIR/rank<N>.json).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import commlab
from tests.worlds._checks import (
    Checks,
    assert_new_tensor,
    assert_reduced,
    assert_unchanged,
    gloo_all_gather,
    gloo_all_reduce,
    random_tensor,
)

ALGORITHMS = ("auto", "one_shot", "two_shot", "ring")
OPS = ("sum", "max", "min")
DTYPES = (torch.float32, torch.bfloat16, torch.int32)


def _shape(checks: Checks, comm, hosts: list[list[int]]) -> None:
    W, me = comm.world_size, comm.rank
    with checks.case("shape", "host map, comm.local, comm.context"):
        assert comm.hosts == hosts, comm.hosts
        mine = next(h for h in hosts if me in h)
        assert comm.local.world_size == 2 and comm.local.rank == mine.index(me)
        assert comm.local.context[1].item() == 2  # the host's world, as kernels see it
        try:
            _ = comm.context
        except commlab.CommlabUsageError as e:
            assert "comm.local.context" in str(e) and "host" in str(e), str(e)
        else:
            raise AssertionError("comm.context did not raise in a world across hosts")
        assert W == 4


def _all_reduce(checks: Checks, gen) -> None:
    i = 0
    for op in OPS:  # every op x algorithm once; dtypes and sizes rotate (a cheap world)
        for algo in ALGORITHMS:
            n, dtype = (7, 1037)[i % 2], DTYPES[i % 3]
            i += 1
            x = random_tensor(gen, (n,), dtype)
            with checks.case("all_reduce", f"n={n} {dtype} {op} {algo}"):
                before = x.clone()
                out = commlab.all_reduce(x, op=op, algorithm=algo)
                assert_unchanged(x, before, "all_reduce")
                assert_new_tensor(out, x, "all_reduce")
                assert_reduced(out, x, gloo_all_reduce(x, op), op, roundings=3)
    for dtype in (torch.float32, torch.int32):  # auto's split path: above 1 MiB
        x = random_tensor(gen, (300_001,), dtype)
        with checks.case("all_reduce", f"split path n=300001 {dtype}"):
            out = commlab.all_reduce(x)
            assert_reduced(out, x, gloo_all_reduce(x, "sum"), "sum", roundings=3)


def _moves(checks: Checks, gen, comm) -> None:
    W, me = comm.world_size, comm.rank
    for dtype in DTYPES:
        x = random_tensor(gen, (W * 3, 5), dtype)
        with checks.case("all_gather", f"{dtype}"):
            out = commlab.all_gather(x)
            ref = torch.cat(gloo_all_gather(x)).to(dtype)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        for op in OPS:
            with checks.case("reduce_scatter", f"{dtype} {op}"):
                out = commlab.reduce_scatter(x, op=op)
                ref = gloo_all_reduce(x, op).view(W, 3, 5)[me]
                assert_reduced(out, x.view(W, 3, 5)[me], ref, op, roundings=3,
                               abs_sum=gloo_all_reduce(x.abs(), "sum").view(W, 3, 5)[me])
        with checks.case("all_to_all", f"{dtype}"):
            out = commlab.all_to_all(x)
            parts = gloo_all_gather(x)
            ref = torch.cat([p.view(W, 3, 5)[me] for p in parts]).to(dtype)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        for src in (0, 3):
            with checks.case("broadcast", f"{dtype} src={src}"):
                out = commlab.broadcast(x, src=src)
                ref = gloo_all_gather(x)[src].to(dtype)
                torch.testing.assert_close(out, ref, rtol=0, atol=0)
                assert_new_tensor(out, x, "broadcast")
    with checks.case("barrier", "barrier, twice"):
        commlab.barrier()
        commlab.barrier()


def _overlap(checks: Checks, gen, comm) -> None:
    W, me = comm.world_size, comm.rank
    a = torch.randn(W * 4, 16, generator=gen).bfloat16()
    b = torch.randn(16, 8, generator=torch.Generator().manual_seed(7)).bfloat16()
    with checks.case("ag_gemm", "bf16"):
        out = commlab.ag_gemm(a, b)
        ref = torch.cat(gloo_all_gather(a)).bfloat16().float() @ b.float()
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-1)
    with checks.case("gemm_rs", "bf16"):
        out = commlab.gemm_rs(a, b)
        ref = gloo_all_reduce(a.float() @ b.float(), "sum").view(W, 4, 8)[me]
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=3e-1)


def _errors(checks: Checks, comm, hosts: list[list[int]]) -> None:
    with checks.case("errors", "a shape differing on one host raises on every rank"):
        x = torch.ones(8 if comm.rank in hosts[0] else 6)
        try:
            commlab.all_reduce(x)
        except commlab.RankMismatchError as e:
            for h, ranks in enumerate(hosts):
                assert f"host {h} (ranks {ranks[0]}, {ranks[1]})" in str(e), e
        else:
            raise AssertionError("no RankMismatchError")
    with checks.case("errors", "a shape differing inside one host names global ranks"):
        x = torch.ones(6 if comm.rank == 3 else 8)
        try:
            commlab.all_reduce(x)
        except commlab.RankMismatchError as e:
            assert "rank 3" in str(e) and f"host {1 if 3 in hosts[1] else 0}" in str(e), e
        else:
            raise AssertionError("no RankMismatchError")
    with checks.case("errors", "symmetric tensors across hosts, then the world goes on"):
        t = commlab.symmetric_zeros((16,))
        assert t.sum().item() == 0
        assert commlab.all_reduce(torch.ones(3))[0].item() == 4


def _torch_backend(checks: Checks, gen, comm) -> None:
    """A "commlab" torch.distributed group over the whole world runs on the world's
    Communicator, so its collectives take the hierarchical path too."""
    W, me = comm.world_size, comm.rank
    group = dist.new_group(backend="commlab")
    x = random_tensor(gen, (W * 3,), torch.float32)
    with checks.case("torch_backend", "dist.all_reduce"):
        t = x.clone()
        dist.all_reduce(t, group=group)
        assert_reduced(t, x, gloo_all_reduce(x, "sum"), "sum", roundings=3)
    with checks.case("torch_backend", "dist.all_gather_into_tensor"):
        out = torch.empty(W * x.numel())
        dist.all_gather_into_tensor(out, x, group=group)
        torch.testing.assert_close(out, torch.cat(gloo_all_gather(x)), rtol=0, atol=0)
    with checks.case("torch_backend", "dist.reduce_scatter_tensor"):
        out = torch.empty(3)
        dist.reduce_scatter_tensor(out, x, group=group)
        ref = gloo_all_reduce(x, "sum").view(W, 3)[me]
        assert_reduced(out, x.view(W, 3)[me], ref, "sum", roundings=3,
                       abs_sum=gloo_all_reduce(x.abs(), "sum").view(W, 3)[me])
    with checks.case("torch_backend", "dist.broadcast"):
        t = x.clone()
        dist.broadcast(t, src=2, group=group)
        torch.testing.assert_close(t, gloo_all_gather(x)[2], rtol=0, atol=0)


def hosts_world(comm, seed: int, hosts=((0, 1), (2, 3))) -> dict:
    """Every check on a world of 4 ranks on ``hosts`` (2 ranks each)."""
    hosts = [list(h) for h in hosts]
    checks = Checks(comm.rank)
    gen = torch.Generator().manual_seed(seed * 1000 + comm.rank)
    _shape(checks, comm, hosts)
    _all_reduce(checks, gen)
    _moves(checks, gen, comm)
    _overlap(checks, gen, comm)
    _errors(checks, comm, hosts)
    _torch_backend(checks, gen, comm)
    return checks.result()


def save_and_finish(comm, out_dir: str, result: dict) -> None:
    """This rank's result as ``out_dir/rank<R>.json`` (what the test reads), then the
    world's end: commlab's, then torch.distributed's."""
    with open(os.path.join(out_dir, f"rank{comm.rank}.json"), "w") as f:
        json.dump(result, f)
    commlab.finalize()
    if dist.is_initialized():
        dist.destroy_process_group()


def main(out_dir: str) -> None:
    comm = commlab.init()
    result = hosts_world(comm, int(os.environ.get("COMMLAB_TEST_SEED") or 1))
    result["hostname"] = os.uname().nodename
    save_and_finish(comm, out_dir, result)


if __name__ == "__main__":
    main(sys.argv[1])
