"""Rank functions for tests/test_racecheck_present.py: a ``cl.wait`` for a value the flag
already holds gives no ordering with the peer's notify, whatever the timing.

Rank 1's flag holds ``PRESENT`` before the launch (a host write); rank 0 stores into
rank 1's buffer and notifies the flag; rank 1 waits for ``WANT`` and loads the buffer.
Each run delays one rank or neither on the host, so rank 1 looks before, while or after
the notify lands; the verdict must be the same every time."""

from __future__ import annotations

import random
import time

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from tests.worlds._checks import Checks

N = 64


@triton.jit
def present_kernel(buf, flag, out, ctx, ADD: tl.constexpr, VALUE: tl.constexpr,
                   WANT: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, N)
    if cl.rank(ctx) == 0:
        tl.store(cl.symm_at(buf + offs, 1, ctx), offs.to(tl.float32) + 1)
        if ADD:
            cl.notify(flag, 1, ctx, VALUE, sig_op="add")
        else:
            cl.notify(flag, 1, ctx, VALUE)
    else:
        cl.wait(flag, WANT)
        tl.store(out + offs, tl.load(buf + offs))


# name -> (value present before the launch, add?, notify value, waits for, a race?)
CASES = {
    "present_add": (1, True, 1, 1, True),     # waits >= 1, 1 already there
    "present_set": (1, False, 1, 1, True),    # the notify writes the value already there
    "present_higher": (2, False, 1, 1, True),  # a higher value already there
    "wait_add_ok": (1, True, 1, 2, False),    # waits for the value only the add makes
    "fresh_ok": (0, False, 1, 1, False),      # the plain handshake
}
DELAYS = ("none", "rank0", "rank1")  # which rank sleeps before launching


def _run(comm, case, delay, flag_from_kernel=False):
    present, add, value, want, _ = CASES[case]
    buf = commlab.symmetric_zeros((N,), torch.float32)
    flag = commlab.symmetric_zeros((4,), torch.int32)
    out = torch.zeros(N)
    if present:
        flag[0] = present
    commlab.barrier()
    text = ""
    try:
        with commlab.racecheck():
            if flag_from_kernel:  # a launch of this block left the value there
                present_kernel[(1,)](buf, flag, out, comm.context, ADD=False,
                                     VALUE=1, WANT=1, N=N)
                commlab.barrier()
                if comm.rank == 1:
                    flag.zero_()  # reset on the host: the next notify is what counts
                commlab.barrier()
            if delay == f"rank{comm.rank}":
                time.sleep(0.3)
            elif delay == "jitter":
                time.sleep(random.random() * 0.05)
            present_kernel[(1,)](buf, flag, out, comm.context, ADD=add, VALUE=value,
                                 WANT=want, N=N)
    except commlab.DataRaceError as e:
        text = str(e)
    commlab.barrier()
    return text


def present_world(comm, runs: int = 0) -> dict:
    """Every case under every delay, and ``runs`` more runs of ``present_add`` with a
    random jitter; per (case, delay) the race texts of this rank."""
    checks = Checks(comm.rank)
    random.seed(1000 + comm.rank)
    found: dict[str, str] = {}
    for case in CASES:
        for delay in DELAYS:
            with checks.case(case, f"{case} delay={delay}"):
                found[f"{case}/{delay}"] = _run(comm, case, delay)
    for delay in DELAYS:
        with checks.case("reset_ok", f"reset on the host, delay={delay}"):
            found[f"reset_ok/{delay}"] = _run(comm, "fresh_ok", delay, flag_from_kernel=True)
    for i in range(runs):
        with checks.case("runs", f"run {i}"):
            found[f"runs/{i}"] = _run(comm, "present_add", "jitter")
    return {**checks.result(), "found": found}
