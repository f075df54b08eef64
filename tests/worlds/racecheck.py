"""Rank functions for tests/test_racecheck.py: planted races in small kernels, a
deadlock under wait_timeout, and commlab's collectives under racecheck."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from tests.worlds._checks import Checks

N = 64


@triton.jit
def push_kernel(buf, flag, out, ctx, WAIT_FIRST: tl.constexpr, N: tl.constexpr):
    """Rank 0 writes rank 1's ``buf`` and notifies it; rank 1 reads ``buf``."""
    offs = tl.arange(0, N)
    if cl.rank(ctx) == 0:
        tl.store(cl.symm_at(buf + offs, 1, ctx), offs.to(tl.float32) + 1)
        cl.notify(flag, 1, ctx, 1)
    else:
        if WAIT_FIRST:
            cl.wait(flag, 1)
        tl.store(out + offs, tl.load(buf + offs))
        if not WAIT_FIRST:
            cl.wait(flag, 1)


@triton.jit
def rounds_kernel(buf, flag, back, out, ctx, EPOCHS: tl.constexpr, ACK: tl.constexpr,
                  N: tl.constexpr):
    """Two rounds of rank 0 -> rank 1 through one buffer. EPOCHS: the flag counts rounds
    (else it is set to 1 each round); ACK: rank 1 says it is done before the next round."""
    offs = tl.arange(0, N)
    for it in range(2):
        want = it + 1 if EPOCHS else 1
        if cl.rank(ctx) == 0:
            if ACK and it > 0:
                cl.wait(back, it)
            tl.store(cl.symm_at(buf + offs, 1, ctx), offs.to(tl.float32) + it)
            cl.notify(flag, 1, ctx, want)
        else:
            cl.wait(flag, want)
            tl.store(out + it * N + offs, tl.load(buf + offs))
            if ACK:
                cl.notify(back, 0, ctx, it + 1)


@triton.jit
def two_programs_kernel(buf, flag, ctx, SIGNAL: tl.constexpr, N: tl.constexpr):
    """Programs 0 and 1 of one launch write the same bytes (SIGNAL: 1 waits for 0)."""
    offs = tl.arange(0, N)
    pid = tl.program_id(0)
    if SIGNAL and pid == 1:
        cl.wait(flag, 1)
    tl.store(buf + offs, offs.to(tl.float32) + pid)
    if SIGNAL and pid == 0:
        cl.notify(flag, cl.rank(ctx), ctx, 1)


@triton.jit
def deadlock_kernel(flag, ctx):
    """Every rank waits for a notify its peer only sends after its own wait."""
    me = cl.rank(ctx)
    cl.wait(flag, 1)
    cl.notify(flag, (me + 1) % cl.num_ranks(ctx), ctx, 1)


@triton.jit
def programs_deadlock_kernel(flag, ctx):
    """Program p of every rank waits on flag[p] for a notify its peer's program p only
    sends after its own wait: two blocked programs per rank, on different flags."""
    p = tl.program_id(0)
    cl.wait(flag + p, 1)
    cl.notify(flag + p, (cl.rank(ctx) + 1) % cl.num_ranks(ctx), ctx, 1)


@triton.jit
def later_program_kernel(flag, ctx):
    """Program 0 waits for program 1 of the same launch (fine on a GPU)."""
    if tl.program_id(0) == 0:
        cl.wait(flag, 1)
    else:
        cl.notify(flag, cl.rank(ctx), ctx, 1)


def _fresh(comm):
    buf = commlab.symmetric_zeros((N,), torch.float32)
    flag = commlab.symmetric_zeros((4,), torch.int32)
    commlab.barrier()
    return buf, flag


def _race(fn) -> str:
    """Run ``fn`` under racecheck; the DataRaceError's text on this rank, or ""."""
    text = ""
    try:
        with commlab.racecheck():
            fn()
    except commlab.DataRaceError as e:
        text = str(e)
    commlab.barrier()
    return text


def planted_world(comm, only=None) -> dict:
    checks = Checks(comm.rank)
    out = torch.zeros(2 * N)
    found = {}
    cases = {
        "load_before_wait": lambda b, f: push_kernel[(1,)](b, f, out, comm.context,
                                                           WAIT_FIRST=False, N=N),
        "load_after_wait": lambda b, f: push_kernel[(1,)](b, f, out, comm.context,
                                                          WAIT_FIRST=True, N=N),
        "already_there": lambda b, f: rounds_kernel[(1,)](b, f, f[2:], out, comm.context,
                                                          EPOCHS=False, ACK=True, N=N),
        "reuse": lambda b, f: rounds_kernel[(1,)](b, f, f[2:], out, comm.context,
                                                  EPOCHS=True, ACK=False, N=N),
        "rounds_ok": lambda b, f: rounds_kernel[(1,)](b, f, f[2:], out, comm.context,
                                                      EPOCHS=True, ACK=True, N=N),
        "two_programs": lambda b, f: two_programs_kernel[(2,)](b, f, comm.context,
                                                               SIGNAL=False, N=N),
        "two_programs_ok": lambda b, f: two_programs_kernel[(2,)](b, f, comm.context,
                                                                  SIGNAL=True, N=N),
    }
    for name, launch in cases.items():
        if only and name not in only:
            continue
        with checks.case(name, name):
            buf, flag = _fresh(comm)
            found[name] = _race(lambda launch=launch, buf=buf, flag=flag: launch(buf, flag))
    with checks.case("usable_after", "a collective after a race"):
        x = torch.full((1000,), float(comm.rank + 1))
        got = commlab.all_reduce(x)
        assert torch.equal(got, torch.full((1000,), float(sum(range(1, comm.world_size + 1)))))
    return {**checks.result(), "found": found}


def deadlock_world(comm) -> dict:
    flag = commlab.symmetric_zeros((4,), torch.int32)
    commlab.barrier()
    text, graph, cycle = "", [], []
    try:
        with commlab.racecheck(wait_timeout=1.0):
            deadlock_kernel[(1,)](flag, comm.context)
    except commlab.WaitTimeoutError as e:
        text = str(e)
        graph, cycle = e.graph, e.cycle
    comm.recover()
    x = torch.ones(100)
    ok = bool(torch.equal(commlab.all_reduce(x), x * comm.world_size))
    later = ""
    flag.zero_()
    commlab.barrier()
    try:
        with commlab.racecheck(wait_timeout=1.0):
            later_program_kernel[(2,)](flag, comm.context)
    except commlab.WaitTimeoutError as e:
        later = str(e)
    comm.recover()
    ok = ok and bool(torch.equal(commlab.all_reduce(x), x * comm.world_size))
    later_flag = int(flag[0])
    flag.zero_()
    commlab.barrier()
    per_program: dict = {}
    try:
        with commlab.racecheck(wait_timeout=1.0):
            programs_deadlock_kernel[(2,)](flag, comm.context)
    except commlab.WaitTimeoutError as e:
        per_program = {"text": str(e), "graph": e.graph, "cycle": e.cycle,
                       "cycle_nodes": e.cycle_nodes, "edges": e.edges}
    comm.recover()
    ok = ok and bool(torch.equal(commlab.all_reduce(x), x * comm.world_size))
    return {"text": text, "usable": ok, "later": later, "later_flag": later_flag,
            "graph": graph, "cycle": cycle, "per_program": per_program}


def collectives_world(comm, repeats: int = 2) -> dict:
    checks = Checks(comm.rank)
    world = comm.world_size
    gen = torch.Generator().manual_seed(comm.rank)
    with commlab.racecheck() as chk:
        for _ in range(repeats):
            a = torch.randn(32, 32, generator=gen).to(torch.bfloat16)
            b = torch.randn(32, 32, generator=gen).to(torch.bfloat16)
            with checks.case("ag_gemm", "ag_gemm fused"):
                commlab.ag_gemm(a, b, algorithm="fused")
            with checks.case("gemm_rs", "gemm_rs fused"):
                commlab.gemm_rs(torch.randn(32 * world, 32, generator=gen).to(torch.bfloat16),
                                b, algorithm="fused")
        for n in (1000, 4096):
            for _ in range(repeats):
                x = torch.randn(n, generator=gen)
                with checks.case("all_reduce", f"all_reduce n={n}"):
                    commlab.all_reduce(x)
                with checks.case("all_gather", f"all_gather n={n}"):
                    commlab.all_gather(x)
                with checks.case("reduce_scatter", f"reduce_scatter n={n}"):
                    commlab.reduce_scatter(torch.randn(n * world, generator=gen))
                with checks.case("broadcast", f"broadcast n={n}"):
                    commlab.broadcast(x, 0)
                with checks.case("all_to_all", f"all_to_all n={n}"):
                    commlab.all_to_all(torch.randn(n * world, generator=gen))
                with checks.case("barrier", "barrier"):
                    commlab.barrier()
        launches = chk.launch_no
    return {**checks.result(), "launches": launches, "accesses": chk.accesses}
