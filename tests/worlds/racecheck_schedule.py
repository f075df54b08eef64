"""Rank functions for tests/test_racecheck_schedule.py: racecheck(shuffle=True, seed=N)
finds an order-dependent deadlock and a lost update, and a seed replays its finding."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from tests.worlds.racecheck import later_program_kernel

SEEDS = range(40)  # seeds tried until one deadlocks (about 1 in 8 does)


@triton.jit
def reuse_count_kernel(cnt, ctx, PROGRAMS: tl.constexpr):
    """Every program counts itself in and waits for all; program 0 then resets the
    counter for reuse, too early for a program that has not looked at it yet."""
    me = cl.rank(ctx)
    cl.notify(cnt, me, ctx, 1, sig_op="add")
    cl.wait(cnt, PROGRAMS)
    if tl.program_id(0) == 0:
        cl.notify(cnt, me, ctx, 0)


@triton.jit
def count_kernel(cnt):
    """Every program adds 1 to a counter with a plain load and store (a lost update)."""
    tl.store(cnt, tl.load(cnt) + 1)


@triton.jit
def later_program_fails_kernel(flag, ctx):
    """Program 0 waits for program 1, which fails (a peer outside the world) first."""
    if tl.program_id(0) == 0:
        cl.wait(flag, 1)
    else:
        cl.notify(flag, cl.num_ranks(ctx) + 5, ctx, 1)


def _failure_text(comm, cnt) -> str:
    """What a failing later program raises from its launch (its waiting peer unwound)."""
    cnt.zero_()
    commlab.barrier()
    try:
        later_program_fails_kernel[(2,)](cnt, comm.context)
    except Exception as e:  # noqa: BLE001 - the test checks what came out
        chain = []
        while e is not None:
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__
        return " <- ".join(chain)
    return ""


def _deadlocks(comm, cnt, seed) -> str:
    """The WaitTimeoutError text of reuse_count_kernel under ``seed`` ("" if it ran)."""
    cnt.zero_()
    commlab.barrier()
    text = ""
    try:
        with commlab.racecheck(wait_timeout=0.5, shuffle=True, seed=seed):
            reuse_count_kernel[(2,)](cnt, comm.context, PROGRAMS=2)
    except commlab.WaitTimeoutError as e:
        text = str(e)
        comm.recover()
    return text


def _count(comm, cnt, seed):
    """(counter after count_kernel with 2 programs under ``seed``, race text)."""
    cnt.zero_()
    commlab.barrier()
    text = ""
    try:
        with commlab.racecheck(shuffle=True, seed=seed):
            count_kernel[(2,)](cnt)
    except commlab.DataRaceError as e:
        text = str(e)
    return int(cnt[0]), text


def schedule_world(comm) -> dict:
    cnt = commlab.symmetric_zeros((4,), torch.int32)
    commlab.barrier()
    plain = ""
    try:  # the default order: program 0 waits, program 1 counts in, both pass
        with commlab.racecheck(wait_timeout=0.5):
            reuse_count_kernel[(2,)](cnt, comm.context, PROGRAMS=2)
    except commlab.WaitTimeoutError as e:
        plain = str(e)
        comm.recover()
    hung = {}
    for s in SEEDS:
        hung[s] = _deadlocks(comm, cnt, s)
        if hung[s]:
            break
    bad = next((s for s in SEEDS if hung.get(s)), None)
    good = next((s for s in SEEDS if not hung[s]), None)
    again = {s: _deadlocks(comm, cnt, s) for s in (bad, good) if s is not None}
    counts = {s: _count(comm, cnt, s) for s in range(4)}
    cnt.zero_()
    commlab.barrier()
    later_program_kernel[(2,)](cnt, comm.context)  # outside racecheck: ends as on a GPU
    later = int(cnt[0])
    failed = _failure_text(comm, cnt)
    x = torch.ones(100)
    usable = bool(torch.equal(commlab.all_reduce(x), x * comm.world_size))
    return {"plain": plain, "hung": hung, "bad": bad, "good": good, "again": again,
            "counts": counts, "later": later, "failed": failed, "usable": usable}
