"""Rank functions for tests/test_collectives.py: every collective against gloo.

Each world function runs many checks and returns ``Checks.result()``; see _checks.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import commlab
from tests.worlds._checks import (
    DTYPES,
    Checks,
    assert_new_tensor,
    assert_reduced,
    assert_unchanged,
    gloo_all_gather,
    gloo_all_reduce,
    random_tensor,
    same_on_every_rank,
    wide,
)

SIZES = (1, 7, 1037)
OPS = ("sum", "max", "min")
ALGORITHMS = ("auto", "one_shot", "two_shot", "ring")


MOVE_ALGORITHMS = ("direct", "copy_engine")


def _gen(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1000 + rank)  # different data per rank


def _all_reduce_cases(world: int):
    """Every op x algorithm x dtype, each at one of SIZES (rotating, shifted by the world
    size so the three worlds cover different pairs), plus every size for sum/auto."""
    i = world
    for dtype in DTYPES:
        for op in OPS:
            for algo in ALGORITHMS:
                sizes = SIZES if (op, algo) == ("sum", "auto") else (SIZES[i % len(SIZES)],)
                i += 1
                for n in sizes:
                    yield n, dtype, op, algo


def check_all_reduce(checks: Checks, gen, world: int) -> None:
    for n, dtype, op, algo in _all_reduce_cases(world):
        x = random_tensor(gen, (n,), dtype)  # fresh data per case
        label = f"all_reduce n={n} {dtype} op={op} algorithm={algo}"
        with checks.case("all_reduce", label):
            before = x.clone()
            out = commlab.all_reduce(x, op=op, algorithm=algo)
            ref = gloo_all_reduce(x, op)
            # ring rounds each of its W-1 partial sums to the dtype (like NCCL)
            roundings = world if algo == "ring" else 1
            assert_reduced(out, x, ref, op, roundings)
            assert_unchanged(x, before, "all_reduce")
            assert_new_tensor(out, x, "all_reduce")
        with checks.case("all_reduce_identical", label):
            assert same_on_every_rank(out), "ranks got different results"


def check_shapes_and_layouts(checks: Checks, gen, world: int) -> None:
    """Multi-dim, non-contiguous, 0-d and empty inputs through every collective."""
    rank = dist.get_rank()
    cases = {
        "3-d": random_tensor(gen, (world * 2, 5, 3), torch.float32),
        "non-contiguous (transposed)": random_tensor(gen, (5, world * 3), torch.float32).t(),
        "non-contiguous (strided)": random_tensor(gen, (world * 4, 6), torch.float32)[:, ::2],
        "empty": torch.empty(0),
        "empty 2-d": torch.empty(0, 4),
    }
    for name, x in cases.items():
        before = x.clone()
        with checks.case("layouts", f"all_reduce {name}"):
            assert_reduced(commlab.all_reduce(x), x, gloo_all_reduce(x, "sum"), "sum")
        with checks.case("layouts", f"all_gather {name}"):
            out = commlab.all_gather(x)
            torch.testing.assert_close(out, torch.cat(gloo_all_gather(x)), rtol=0, atol=0)
        with checks.case("layouts", f"reduce_scatter {name}"):
            out = commlab.reduce_scatter(x)
            ref = gloo_all_reduce(x, "sum").chunk(world)[rank] if x.numel() else x
            assert out.shape == (x.shape[0] // world, *x.shape[1:]), tuple(out.shape)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        with checks.case("layouts", f"broadcast {name}"):
            ref = x.contiguous().clone()
            dist.broadcast(ref, src=world - 1)
            torch.testing.assert_close(commlab.broadcast(x, src=world - 1), ref, rtol=0, atol=0)
        with checks.case("layouts", f"all_to_all {name}"):
            out = commlab.all_to_all(x)
            ref = torch.cat([p.chunk(world)[rank] for p in gloo_all_gather(x)]) \
                if x.numel() else x
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        with checks.case("layouts", f"{name} input unchanged"):
            assert_unchanged(x, before, "a collective")
    with checks.case("layouts", "all_reduce of a 0-d tensor"):
        x = random_tensor(gen, (), torch.float32)
        out = commlab.all_reduce(x)
        assert out.shape == (), tuple(out.shape)
        assert_reduced(out, x, gloo_all_reduce(x, "sum"), "sum")


def check_data_movement(checks: Checks, gen, world: int) -> None:
    """all_gather, reduce_scatter, broadcast (every src), all_to_all for every dtype."""
    rank = dist.get_rank()
    for i, dtype in enumerate(DTYPES):
        for rows in (SIZES[(i + world) % len(SIZES)],):  # one size per dtype, rotating
            x = random_tensor(gen, (rows * world, 3), dtype)
            before = x.clone()
            label = f"{dtype} shape={tuple(x.shape)}"
            for algo in MOVE_ALGORITHMS:
                with checks.case("all_gather", f"{label} {algo}"):
                    out = commlab.all_gather(x, algorithm=algo)
                    ref = torch.cat(gloo_all_gather(x)).to(dtype)
                    assert out.shape == (world * x.shape[0], 3)
                    torch.testing.assert_close(out, ref, rtol=0, atol=0)
                    assert_new_tensor(out, x, "all_gather")
            for op in ("sum", "max", "min"):
                with checks.case("reduce_scatter", f"{label} op={op}"):
                    out = commlab.reduce_scatter(x, op=op)
                    ref = gloo_all_reduce(x, op).chunk(world)[rank]
                    abs_sum = gloo_all_reduce(x.abs(), "sum").chunk(world)[rank]
                    assert_reduced(out, x.chunk(world)[rank], ref, op, abs_sum=abs_sum)
            for src in range(world):
                algo = MOVE_ALGORITHMS[(src + i) % 2]  # both algorithms, every src over dtypes
                with checks.case("broadcast", f"{label} src={src} {algo}"):
                    out = commlab.broadcast(x, src=src, algorithm=algo)
                    ref = wide(x)
                    dist.broadcast(ref, src=src)
                    torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)
                    assert_new_tensor(out, x, "broadcast")
            for algo in MOVE_ALGORITHMS:
                with checks.case("all_to_all", f"{label} {algo}"):
                    out = commlab.all_to_all(x, algorithm=algo)
                    ref = torch.cat([p.chunk(world)[rank] for p in gloo_all_gather(x)]).to(dtype)
                    torch.testing.assert_close(out, ref, rtol=0, atol=0)
                    assert_new_tensor(out, x, "all_to_all")
            with checks.case("inputs_unchanged", label):
                assert_unchanged(x, before, "all_gather/reduce_scatter/broadcast/all_to_all")


def check_outputs_survive_later_calls(checks: Checks, gen, world: int) -> None:
    """An output is the caller's: later collectives (which reuse the scratch) leave it be."""
    with checks.case("outputs_are_new", "all_reduce result kept across 5 later calls"):
        x = random_tensor(gen, (513,), torch.float32)
        out = commlab.all_reduce(x)
        kept = out.clone()
        for _ in range(5):
            commlab.all_reduce(random_tensor(gen, (513,), torch.float32))
            commlab.all_gather(random_tensor(gen, (513,), torch.float32))
        assert torch.equal(out, kept), "a later collective overwrote an earlier output"


def check_barrier(checks: Checks, gen, world: int) -> None:
    rank = dist.get_rank()
    with checks.case("barrier", "nobody leaves before the last rank arrives"):
        time.sleep(0.15 * rank)
        arrived = time.monotonic()  # CLOCK_MONOTONIC is shared by all processes
        commlab.barrier()
        left = time.monotonic()
        times = [None] * world
        dist.all_gather_object(times, (arrived, left))
        last_arrival = max(a for a, _ in times)
        first_exit = min(b for _, b in times)
        assert first_exit >= last_arrival, f"a rank left at {first_exit} < {last_arrival}"


def check_chunked(checks: Checks, gen, world: int, n: int) -> None:
    """Inputs larger than the scratch go through in pieces; every piece lands right."""
    rank = dist.get_rank()
    x = random_tensor(gen, (n,), torch.float32)
    for algo in ("one_shot", "two_shot", "ring"):
        with checks.case("chunked", f"all_reduce {algo} n={n}"):
            assert_reduced(commlab.all_reduce(x, algorithm=algo), x, gloo_all_reduce(x, "sum"),
                           "sum", world if algo == "ring" else 1)
    with checks.case("chunked", f"all_gather copy_engine n={n}"):
        torch.testing.assert_close(commlab.all_gather(x, algorithm="copy_engine"),
                                   torch.cat(gloo_all_gather(x)), rtol=0, atol=0)
    with checks.case("chunked", f"all_gather n={n}"):
        torch.testing.assert_close(commlab.all_gather(x), torch.cat(gloo_all_gather(x)),
                                   rtol=0, atol=0)
    with checks.case("chunked", f"reduce_scatter n={n}"):
        assert_reduced(commlab.reduce_scatter(x), x.chunk(world)[rank],
                       gloo_all_reduce(x, "sum").chunk(world)[rank], "sum",
                       abs_sum=gloo_all_reduce(x.abs(), "sum").chunk(world)[rank])
    with checks.case("chunked", f"broadcast n={n}"):
        ref = x.clone()
        dist.broadcast(ref, src=0)
        torch.testing.assert_close(commlab.broadcast(x, src=0), ref, rtol=0, atol=0)
    with checks.case("chunked", f"all_to_all n={n}"):
        ref = torch.cat([p.chunk(world)[rank] for p in gloo_all_gather(x)])
        torch.testing.assert_close(commlab.all_to_all(x), ref, rtol=0, atol=0)


def collectives_world(comm, seed: int, chunked_n: int = 0) -> dict:
    """Everything in test_collectives for one world size."""
    checks = Checks(comm.rank)
    gen = _gen(seed, comm.rank)
    world = comm.world_size
    check_all_reduce(checks, gen, world)
    with checks.case("copy_engine_state", "the first copy-engine exchange allocates nothing"):
        # its counter and flags live in the heap's flag area: a first exchange inside a
        # CUDA-graph capture must not allocate (or zero) anything
        free = comm.heap.arena.free_bytes
        x = random_tensor(gen, (world * 5,), torch.float32)
        torch.testing.assert_close(commlab.all_gather(x, algorithm="copy_engine"),
                                   torch.cat(gloo_all_gather(x)), rtol=0, atol=0)
        assert comm.heap.arena.free_bytes == free
    check_data_movement(checks, gen, world)
    check_shapes_and_layouts(checks, gen, world)
    check_outputs_survive_later_calls(checks, gen, world)
    check_barrier(checks, gen, world)
    if chunked_n:
        check_chunked(checks, gen, world, chunked_n)
    return checks.result()


# --- back to back -----------------------------------------------------------------


def _plan(seed: int, calls: int, world: int) -> list[tuple]:
    """The same random sequence of (op, dtype, n, extra) on every rank."""
    g = torch.Generator().manual_seed(seed)
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier")
    plan = []
    for _ in range(calls):
        op = ops[int(torch.randint(len(ops), (1,), generator=g))]
        dtype = DTYPES[int(torch.randint(len(DTYPES), (1,), generator=g))]
        n = int(torch.exp(torch.rand(1, generator=g) * 11.5))  # 1 .. ~100k, log-uniform
        n = max(world, n // world * world)
        extra = int(torch.randint(world, (1,), generator=g))  # src; algorithm index
        plan.append((op, dtype, n, extra))
    return plan


def _input(seed: int, i: int, rank: int, dtype, n: int) -> torch.Tensor:
    return random_tensor(torch.Generator().manual_seed((seed * 7919 + i) * 64 + rank), (n,), dtype)


def back_to_back_world(comm, seed: int, calls: int) -> dict:
    """``calls`` collectives of random ops and sizes with no host sync in between; checked
    afterwards against references built from every rank's (regenerated) inputs."""
    checks = Checks(comm.rank)
    world, rank = comm.world_size, comm.rank
    plan = _plan(seed, calls, world)
    algos = ("one_shot", "two_shot", "ring")
    outs = []
    start = time.monotonic()
    for i, (op, dtype, n, extra) in enumerate(plan):
        x = _input(seed, i, rank, dtype, n)
        if op == "all_reduce":
            outs.append(commlab.all_reduce(x, algorithm=algos[extra % 3]))
        elif op == "broadcast":  # SM and copy-engine calls mixed: they share the scratch
            outs.append(commlab.broadcast(x, src=extra, algorithm=MOVE_ALGORITHMS[i % 2]))
        elif op == "barrier":
            outs.append(commlab.barrier())
        elif op in ("all_gather", "all_to_all"):
            outs.append(getattr(commlab, op)(x, algorithm=MOVE_ALGORITHMS[i % 2]))
        else:
            outs.append(getattr(commlab, op)(x))
    elapsed = time.monotonic() - start
    for i, ((op, dtype, n, extra), out) in enumerate(zip(plan, outs, strict=True)):
        if op == "barrier":
            continue
        xs = [_input(seed, i, r, dtype, n) for r in range(world)]
        with checks.case("back_to_back", f"call {i}: {op} {dtype} n={n} extra={extra}"):
            if op == "all_reduce":
                ref = torch.stack([wide(x) for x in xs]).sum(0)
                if dtype in (torch.float16, torch.bfloat16, torch.float32):
                    bound = world * torch.finfo(dtype).eps * torch.stack(
                        [wide(x).abs() for x in xs]).sum(0) + 1e-5
                    assert bool(((out.float() - ref).abs() <= bound).all()), "sum off"
                else:
                    assert torch.equal(out, ref.to(dtype))
            elif op == "all_gather":
                assert torch.equal(out, torch.cat(xs))
            elif op == "reduce_scatter":
                ref = torch.stack([wide(x) for x in xs]).sum(0).chunk(world)[rank]
                exact = dtype == torch.int32
                torch.testing.assert_close(out.float(), ref.float(),
                                           rtol=0 if exact else 2 * torch.finfo(dtype).eps,
                                           atol=0 if exact else 1e-4)
            elif op == "broadcast":
                assert torch.equal(out, xs[extra])
            else:
                assert torch.equal(out, torch.cat([x.chunk(world)[rank] for x in xs]))
    result = checks.result()
    result["calls"] = len(plan)
    result["seconds"] = elapsed
    return result
