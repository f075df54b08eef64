"""Per-program epochs: point-to-point synchronisation with no reset and no host state.

The flag area of every rank's heap holds, for each program id p (up to 256):

    flags[p]                         how many calls program p has made (local only)
    flags[256 + p * 64 + src]        the last value rank `src`'s program p signalled us

A call by program p takes ``n = flags[p] + 1`` and signals with values ``n * 64 + k``
(k = 1, 2, … for the phases of one call). Values only grow, so a wait is simply
"slot >= value", nothing is ever reset, and a kernel replayed from a CUDA graph (whose
arguments are frozen) still gets fresh values: the counter lives in device memory.
Every rank launches the same grids in the same order, so program p's counter agrees on
all ranks. ``comm.recover()`` zeroes the whole area on every rank at once.
"""

from __future__ import annotations

import triton
import triton.language as tl

import commlab.language as cl

SLOTS = tl.constexpr(256)
PHASES = tl.constexpr(64)


@triton.jit
def _flag_base(ctx):
    return tl.load(ctx + 3).to(tl.pointer_type(tl.int32))


@triton.jit
def begin_call(ctx):
    """This program's call number n (>= 1) for the call that is starting."""
    return tl.load(_flag_base(ctx) + tl.program_id(0)) + 1


@triton.jit
def end_call(ctx, n):
    tl.store(_flag_base(ctx) + tl.program_id(0), n)


@triton.jit
def signal(ctx, peer, value):
    """Release: our earlier stores (local or remote) are visible to ``peer``'s same
    program once it sees ``value`` in its slot for us."""
    me = tl.load(ctx)
    slot = _flag_base(ctx) + SLOTS + tl.program_id(0) * 64 + me
    cl.notify(slot, peer, ctx, value, sig_op="set")


@triton.jit
def wait_from(ctx, src, value):
    """Acquire: returns once rank ``src``'s same program signalled ``value`` or more."""
    slot = _flag_base(ctx) + SLOTS + tl.program_id(0) * 64 + src
    cl.wait(slot, value)


@triton.jit
def signal_all(ctx, value):
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    for i in range(1, world):
        signal(ctx, (me + i) % world, value)


@triton.jit
def wait_all(ctx, value):
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    for i in range(1, world):
        wait_from(ctx, (me + i) % world, value)


