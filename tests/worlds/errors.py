"""Rank functions for tests/test_errors.py: each bad call must raise the same clear error
on every rank before any kernel launches, and the world must work right afterwards."""

from __future__ import annotations

import gc
import time

import torch

import commlab
from tests.worlds._checks import Checks


def _expect(checks: Checks, name: str, call, error: type, *needles: str,
            once: str = "", not_a: type | None = None) -> None:
    """Run ``call`` expecting ``error`` (not ``not_a``) whose message holds every needle (and
    ``once`` exactly once); no collective span may be recorded (nothing launched); then a
    correct all_reduce must work."""
    world = commlab.get_communicator().world_size
    with checks.case(name, "raises"):
        commlab.trace.start()
        try:
            call()
        except error as e:
            msg = str(e)
            assert not_a is None or not isinstance(e, not_a), f"{type(e).__name__}: {msg}"
            missing = [n for n in needles if n not in msg]
            assert not missing, f"message lacks {missing}: {msg!r}"
            if once:
                assert msg.count(once) == 1, f"{once!r} not named exactly once: {msg!r}"
        else:
            raise AssertionError(f"no {error.__name__} raised")
        finally:
            spans = commlab.trace.stop()
        launched = [s.name for s in spans if s.kind == "comm"]
        assert not launched, f"launched {launched} before raising"
    with checks.case(name, "world usable afterwards"):
        out = commlab.all_reduce(torch.full((33,), 1.0))
        assert torch.equal(out, torch.full((33,), float(world))), out


def errors_world(comm) -> dict:
    checks = Checks(comm.rank)
    rank, world = comm.rank, comm.world_size
    x = torch.ones(4 * world)
    _expect(checks, "shape_mismatch",
            lambda: commlab.all_reduce(torch.ones(4 * world + (rank == 1))),
            commlab.RankMismatchError, "shape", "rank 1: (13,)", "ranks 0, 2: (12,)")
    _expect(checks, "shape_mismatch_all_gather",
            lambda: commlab.all_gather(torch.ones(5, 2 + (rank == 2))),
            commlab.RankMismatchError, "shape", "rank 2", "ranks 0, 1")
    _expect(checks, "dtype_mismatch",
            lambda: commlab.all_reduce(x.half() if rank == 2 else x),
            commlab.RankMismatchError, "dtype", "float16", "float32", "rank 2")
    deep = (1,) * 80  # its signature is longer than an agreement slot
    _expect(checks, "long_signature_op_mismatch",
            lambda: commlab.all_reduce(torch.ones(deep), op="max" if rank == 1 else "sum"),
            commlab.RankMismatchError, "op differs", "rank 1: max", "sum")
    _expect(checks, "long_signature_shape_mismatch",
            lambda: commlab.all_reduce(torch.ones(deep[:-1] + (1 + (rank == 2),))),
            commlab.RankMismatchError, "differ across ranks", "shape", "rank 2")
    for op in ("reduce_scatter", "all_to_all"):
        _expect(checks, "indivisible_dim0",
                lambda op=op: getattr(commlab, op)(torch.ones(world + 1, 3)),
                commlab.CommlabUsageError, op, "dim 0", str(world + 1), "divisible")
    for dtype in (torch.float64, torch.int64):
        name = str(dtype).replace("torch.", "")
        _expect(checks, "unsupported_dtype",
                lambda dtype=dtype: commlab.all_reduce(x.to(dtype)),
                commlab.CommlabUsageError, name, "float32")
        _expect(checks, "unsupported_dtype",
                lambda dtype=dtype: commlab.all_gather(x.to(dtype)),
                commlab.CommlabUsageError, name)
    _expect(checks, "unsupported_dtype_on_one_rank",
            lambda: commlab.all_reduce(x.double() if rank == 1 else x),
            commlab.RankMismatchError, "float64", "rank 1")
    _expect(checks, "unsupported_op", lambda: commlab.all_reduce(x, op="prod"),
            commlab.CommlabUsageError, "'prod'", "'sum'")
    _expect(checks, "unsupported_op", lambda: commlab.reduce_scatter(x, op="avg"),
            commlab.CommlabUsageError, "'avg'")
    _expect(checks, "unknown_algorithm", lambda: commlab.all_reduce(x, algorithm="tree"),
            commlab.CommlabUsageError, "'tree'", "'ring'")
    _expect(checks, "unknown_algorithm", lambda: commlab.all_gather(x, algorithm="ring"),
            commlab.CommlabUsageError, "'ring'", "'copy_engine'", once="all_gather")
    for op in ("all_reduce", "reduce_scatter"):
        _expect(checks, "op_none", lambda op=op: getattr(commlab, op)(x, op=None),
                commlab.CommlabUsageError, f"{op}: op must be one of", "'sum'", "got None",
                once=op, not_a=commlab.RankMismatchError)
    for op in ("all_reduce", "all_gather", "all_to_all", "broadcast"):
        _expect(checks, "algorithm_none", lambda op=op: getattr(commlab, op)(x, algorithm=None),
                commlab.CommlabUsageError, "algorithm must be one of", "'auto'", "got None",
                once=op, not_a=commlab.RankMismatchError)
    _expect(checks, "unknown_keyword_on_one_rank",
            lambda: commlab.all_reduce(x, **({"opp": "max"} if rank == 1 else {})),
            commlab.RankMismatchError, "all_reduce: on rank 1: TypeError:",
            "unexpected keyword argument 'opp'", "the signature is all_reduce(x")
    _expect(checks, "unknown_keyword_on_one_rank",
            lambda: commlab.symmetric_zeros((4,), **({"dtyp": 1} if rank == 0 else {})),
            commlab.RankMismatchError, "on rank 0: TypeError:", "'dtyp'")
    _expect(checks, "local_error_on_every_rank",
            lambda: commlab.all_gather(x, algorthm="ring"),
            commlab.CommlabUsageError, "all_gather: TypeError:", "'algorthm'",
            once="all_gather:", not_a=commlab.RankMismatchError)
    for src in (world, -1):
        _expect(checks, "broadcast_src_out_of_range",
                lambda src=src: commlab.broadcast(x, src=src),
                commlab.CommlabUsageError, "src", str(src), f"0..{world - 1}")
    _expect(checks, "heap_full",
            lambda: commlab.symmetric_empty((1 << 30,), torch.float32),
            commlab.HeapFullError, "requested", str(4 << 30), "free")
    _expect(checks, "heap_full_on_one_rank",
            lambda: commlab.symmetric_empty((1 << 30,) if rank == 1 else (64,)),
            commlab.CommlabError, "symmetric_empty", "on rank 1", "heap full", "requested")
    _expect(checks, "allocation_order", lambda: _allocate_out_of_order(rank),
            commlab.RankMismatchError, "heap offset", "same order")
    with checks.case("allocation_order", "symmetric allocation works afterwards"):
        t = commlab.symmetric_zeros((10,), torch.int32)
        assert t.shape == (10,) and not t.any()
    _timeout_then_recover(checks, rank, world)
    return checks.result()


def _allocate_out_of_order(rank: int) -> None:
    a = commlab.symmetric_empty((64,))
    b = commlab.symmetric_empty((64,))
    if rank == 1:  # rank 1 frees a, the others free b: the next block differs
        del a
    else:
        del b
    gc.collect()
    commlab.symmetric_empty((64,))


def _timeout_then_recover(checks: Checks, rank: int, world: int) -> None:
    """Rank ``world - 1`` skips a collective: the others must name it after the timeout;
    after ``comm.recover()`` on every rank the world works again."""
    commlab.finalize()
    comm = commlab.init(backend="cpu", timeout=3)
    missing = world - 1
    with checks.case("timeout", "a rank that never arrives is named"):
        if rank != missing:
            start = time.monotonic()
            try:
                commlab.all_reduce(torch.ones(8))
            except commlab.CollectiveTimeoutError as e:
                waited = time.monotonic() - start
                assert f"rank {missing} did not arrive" in str(e), str(e)
                assert 2.5 < waited < 30, f"raised after {waited:.1f} s, timeout is 3 s"
            else:
                raise AssertionError("no CollectiveTimeoutError")
    comm.recover()
    with checks.case("timeout", "world usable after recover()"):
        for n in (5, 4099):
            out = commlab.all_reduce(torch.full((n,), float(rank)))
            assert torch.equal(out, torch.full((n,), float(sum(range(world))))), out
        commlab.barrier()


def cuda_world(comm) -> None:  # never reached: init(backend="cuda") raises on CPU ranks
    raise AssertionError("commlab.init(backend='cuda') succeeded without a GPU")
