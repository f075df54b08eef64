"""Rank functions for tests/test_heap.py: the symmetric heap's allocations, offsets,
freeing, sizes and lifecycle (init/finalize), and a rank killed mid-run."""

from __future__ import annotations

import gc
import os
import signal
import time

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from tests.worlds._checks import Checks


@triton.jit
def _stamp_every_peer_kernel(t_ptr, ctx):
    """Write our rank into slot ``me`` of every rank's copy of ``t`` (needs equal offsets)."""
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    for p in range(0, world):
        tl.store(cl.symm_at(t_ptr + me, p, ctx), me + 1)
    cl.barrier(ctx)  # every rank's stamps have landed everywhere


def _shm_names(token: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"commlab-{token}")]


def heap_world(comm) -> dict:
    checks = Checks(comm.rank)
    world = comm.world_size
    tokens = [comm._world.token]
    with checks.case("shapes_dtypes", "symmetric_empty/zeros give the asked shape and dtype"):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int8,
                      torch.float64):
            for shape in ((), (7,), (3, 5), (2, 0, 4), 11):
                for make in (commlab.symmetric_empty, commlab.symmetric_zeros):
                    t = make(shape, dtype=dtype)
                    want = (shape,) if isinstance(shape, int) else shape
                    assert t.shape == want and t.dtype == dtype, (make, t.shape, t.dtype)
                    assert t.is_contiguous() and t.device.type == "cpu"
                    if make is commlab.symmetric_zeros:
                        assert not t.any(), "symmetric_zeros not zero"
        t = commlab.symmetric_zeros((1000,), torch.float32)
        t.fill_(3.0)  # writable
        assert float(t.sum()) == 3000.0
    with checks.case("same_offset", "a peer's copy is reachable at the same offset"):
        t = commlab.symmetric_zeros((world,), torch.int32)
        _stamp_every_peer_kernel[(1,)](t, comm.context)
        assert t.tolist() == list(range(1, world + 1)), t.tolist()
        offsets = [None] * world
        torch.distributed.all_gather_object(offsets, comm.heap.offset_of(t))
        assert len(set(offsets)) == 1 and offsets[0] is not None, offsets
    with checks.case("free_and_reuse", "garbage-collected blocks are freed and reused"):
        gc.collect()
        free0 = comm.heap.arena.free_bytes
        a = commlab.symmetric_empty((1000,))
        off = comm.heap.offset_of(a)
        assert comm.heap.arena.free_bytes < free0
        view = a[10:20]
        del a
        gc.collect()
        assert comm.heap.arena.free_bytes < free0, "freed while a view is alive"
        del view
        gc.collect()
        assert comm.heap.arena.free_bytes == free0, "not freed after the last view died"
        b = commlab.symmetric_empty((1000,))
        assert comm.heap.offset_of(b) == off, "the freed block was not reused"
        del b
    with checks.case("free_and_reuse", "filling the heap, then freeing, makes room again"):
        blocks = []
        try:
            while True:
                blocks.append(commlab.symmetric_empty((1 << 20,), torch.uint8))
        except commlab.HeapFullError as e:
            assert "requested 1.0 MiB" in str(e) and "free" in str(e), str(e)
        assert len(blocks) > 5, len(blocks)
        blocks.clear()
        gc.collect()
        big = commlab.symmetric_empty((5 << 20,), torch.uint8)  # room again
        assert big.numel() == 5 << 20
        del big
    with checks.case("init_twice", "init() again returns the same communicator"):
        assert commlab.init() is comm and commlab.init(backend="cpu") is comm
        assert commlab.get_communicator() is comm
    with checks.case("no_shm_files", "segments are unlinked once every rank mapped them"):
        assert _shm_names(comm._world.token) == [], _shm_names(comm._world.token)
    with checks.case("sizes", "heap_size and scratch_size are honoured"):
        commlab.finalize()
        try:
            commlab.get_communicator()
            raise AssertionError("get_communicator() worked after finalize()")
        except commlab.CommlabUsageError:
            pass
        comm = commlab.init(backend="cpu", heap_size="24MiB", scratch_size="1MiB")
        tokens.append(comm._world.token)
        assert comm.heap.size == 24 << 20 and comm.scratch_bytes == 1 << 20
        n = 700_001  # 2.8 MB of float32: three pieces through the 1 MiB scratch
        x = torch.full((n,), float(comm.rank + 1))
        out = commlab.all_reduce(x, algorithm="two_shot")
        assert torch.equal(out, torch.full((n,), float(sum(range(1, world + 1)))))
        try:
            commlab.symmetric_empty((24 << 20,), torch.uint8)
            raise AssertionError("allocated more than the heap")
        except commlab.HeapFullError:
            pass
    with checks.case("sizes", "COMMLAB_HEAP_SIZE sets the default heap size"):
        commlab.finalize()
        os.environ["COMMLAB_HEAP_SIZE"] = "20MiB"
        try:
            comm = commlab.init(backend="cpu")
        finally:
            del os.environ["COMMLAB_HEAP_SIZE"]
        tokens.append(comm._world.token)
        assert comm.heap.size == 20 << 20, comm.heap.size
    with checks.case("finalize_then_init", "a re-initialised world runs collectives"):
        y = commlab.all_gather(torch.full((3,), comm.rank, dtype=torch.int32))
        assert y.tolist() == [r for r in range(world) for _ in range(3)], y.tolist()
        commlab.barrier()
    result = checks.result()
    result["tokens"] = tokens
    return result


def killed_rank_world(comm, report_path: str) -> None:
    """Rank 1 SIGKILLs itself after init and an allocation; rank 0 must get a
    RankLostError naming rank 1, and write what happened to ``report_path``."""
    keep = commlab.symmetric_zeros((4096,))  # noqa: F841 (alive while the rank dies)
    commlab.all_reduce(torch.ones(16))
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    report = f"token={comm._world.token}\n"
    try:
        # not a repeat of the call above: a repeat runs ahead of the agreement
        # (commlab.runtime._ahead) and meets the missing rank in its kernel instead
        commlab.all_reduce(torch.ones(17))
        report += "no error\n"
    except commlab.RankLostError as e:
        report += f"lost: {e}\n"
    with open(report_path, "w") as f:
        f.write(report)
