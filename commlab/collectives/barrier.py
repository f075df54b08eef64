"""Barrier: returns on every rank once every rank has called it.

The host side meets through the agreement block (so a missing rank is named after the
timeout); on CUDA a one-program kernel also meets on the device, so work queued before
the barrier on any rank is complete before work queued after it starts.
"""

from __future__ import annotations

import triton

import commlab.collectives._across as _across
import commlab.language as cl
from commlab.collectives._common import agree, comm_or_raise, traced
from commlab.runtime.communicator import publishes_local_errors


@triton.jit
def barrier_kernel(ctx):
    cl.barrier(ctx)  # program 0 of every rank meets


@publishes_local_errors()
def barrier() -> None:
    """Block until every rank has reached this barrier (host and device)."""
    comm = comm_or_raise()
    if _across.spans_hosts(comm):
        return _across.run("barrier")
    agree("barrier", None, "")
    with traced("barrier", 0, "signal", comm.device, None, comm):
        barrier_kernel[(1,)](comm.context)
