"""A user kernel written here with commlab.language, run on 2 and 3 CPU ranks:
cl.rank / num_ranks / symm_at (scalar and block pointers) / notify (set, add) / wait /
barrier, launched three times so signals that only grow work across launches."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import commlab  # before the kernels below: picks Triton's interpreter on CPU
import commlab.language as cl
from tests.conftest import assert_checks
from tests.worlds._checks import Checks

N = 16


@triton.jit
def pass_right_kernel(
    # Symmetric buffers
    data_ptr,  # [N] int32: the left neighbour writes here
    flags_ptr,  # [2] int32: [0] "data arrived" (set), [1] arrivals counter (add)
    # Local buffers
    out_ptr,  # [N + 4] int32
    ctx,
    # Sizes
    EPOCH,  # launches so far: signals only grow, so no reset between launches
    # Meta-parameters
    N: tl.constexpr,
):
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    right = (me + 1) % world
    offs = tl.arange(0, N)
    # --- block store through symm_at into the right neighbour's data, then signal it
    tl.store(cl.symm_at(data_ptr, right, ctx) + offs, me * 1000 + EPOCH * 100 + offs)
    cl.notify(flags_ptr, right, ctx, EPOCH + 1, sig_op="set")
    cl.wait(flags_ptr, EPOCH + 1)  # the left neighbour's data is here
    tl.store(out_ptr + offs, tl.load(data_ptr + offs))
    # --- every rank bumps every rank's counter: it reaches world * (EPOCH + 1)
    for p in range(0, world):
        cl.notify(flags_ptr + 1, p, ctx, 1, sig_op="add")
    cl.wait(flags_ptr + 1, world * (EPOCH + 1))
    cl.barrier(ctx)  # all adds of this launch have landed everywhere
    # --- scalar symm_at: read the left neighbour's counter
    left = (me + world - 1) % world
    tl.store(out_ptr + N, tl.load(cl.symm_at(flags_ptr + 1, left, ctx)))
    tl.store(out_ptr + N + 1, me)
    tl.store(out_ptr + N + 2, world)
    cl.barrier(ctx)  # nobody starts the next launch while a peer still reads our counter


def language_world(comm) -> dict:
    checks = Checks(comm.rank)
    me, world = comm.rank, comm.world_size
    data = commlab.symmetric_zeros((N,), torch.int32)
    flags = commlab.symmetric_zeros((2,), torch.int32)
    left = (me + world - 1) % world
    for epoch in range(3):
        out = torch.full((N + 4,), -1, dtype=torch.int32)
        pass_right_kernel[(1,)](data, flags, out, comm.context, epoch, N=N)
        with checks.case("rank_num_ranks", f"launch {epoch}"):
            assert out[N + 1] == me and out[N + 2] == world, out.tolist()
        with checks.case("symm_at_block_store", f"launch {epoch}"):
            want = [left * 1000 + epoch * 100 + i for i in range(N)]
            assert out[:N].tolist() == want, out[:N].tolist()
        # (read after the launch: the left neighbour may already be in the next one, which
        # sets flags[0] to epoch + 2 and adds its share to flags[1])
        with checks.case("notify_set_and_wait", f"launch {epoch}"):
            assert int(flags[0]) in (epoch + 1, epoch + 2), flags.tolist()
        with checks.case("notify_add", f"launch {epoch}"):
            assert world * (epoch + 1) <= int(flags[1]) <= world * (epoch + 2), flags.tolist()
            assert int(out[N]) == world * (epoch + 1), out.tolist()  # scalar symm_at read
    with checks.case("barrier_then_collective", "a collective after a user kernel works"):
        y = commlab.all_reduce(torch.ones(7))
        assert torch.equal(y, torch.full((7,), float(world)))
    return checks.result()


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def results(request):
    from commlab.testing import run_world

    return run_world(language_world, request.param, timeout=180,
                     env={"COMMLAB_TIMEOUT": "60"})


def test_rank_and_num_ranks_read_the_context(results):
    assert_checks(results, "rank_num_ranks")


def test_symm_at_block_stores_land_in_the_peer_heap(results):
    assert_checks(results, "symm_at_block_store")


def test_notify_set_publishes_data_that_wait_then_sees(results):
    assert_checks(results, "notify_set_and_wait")


def test_notify_add_counts_every_signal_exactly_once(results):
    assert_checks(results, "notify_add")


def test_collectives_still_work_after_a_user_kernel(results):
    assert_checks(results, "barrier_then_collective")


HELPERS_FIRST = """
import triton, triton.language as tl   # before commlab: Triton's helpers decorated first
import torch
import commlab

@triton.jit
def helpers_kernel(out_ptr, N: tl.constexpr):
    ones = tl.zeros((N,), dtype=tl.float32) + 1.0
    tl.store(out_ptr + tl.arange(0, N), ones * tl.cdiv(7, 2) + tl.sum(ones, axis=0))

out = torch.empty(8)
helpers_kernel[(1,)](out, N=8)
assert out.tolist() == [12.0] * 8, out
print("ok")
"""


def test_triton_helpers_work_in_kernels_when_triton_was_imported_before_commlab(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    env["COMMLAB_BACKEND"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", HELPERS_FIRST], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
