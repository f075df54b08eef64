"""Per-program epochs: point-to-point synchronisation with no reset and no host state.

The flag area of every rank's heap holds, for each program id p (up to 256):

    flags[p]                                   calls program p has made (local only)
    flags[256 + bank*16384 + p*64 + src]       last value rank `src`'s program p sent us
                                               on signal bank `bank` (0 or 1)

A call by program p takes ``n = flags[p] + 1`` and signals with values ``n * 64 + k``
(k = 1 … 63 for the steps of one call). Within a bank values only grow, so a wait is
"slot >= value", nothing is ever reset, and a kernel replayed from a CUDA graph (whose
arguments are frozen) still gets fresh values: the counter lives in device memory.
Two banks let a pipelined kernel run two streams of steps (e.g. reduce-scatter rounds
and all-gather rounds) without one's larger values satisfying the other's waits.
Every rank launches the same grids in the same order, so program p's counter agrees on
all ranks. ``comm.recover()`` zeroes the whole area on every rank at once.
"""

from __future__ import annotations

import triton
import triton.language as tl

import commlab.language as cl
from commlab.runtime.heap import MAX_BARRIER_BLOCKS, MAX_WORLD

SLOTS = tl.constexpr(MAX_BARRIER_BLOCKS)  # one call counter per program id
WIDTH = tl.constexpr(MAX_WORLD)  # one arrival slot per source rank
BANK = tl.constexpr(MAX_BARRIER_BLOCKS * MAX_WORLD)
PHASES = tl.constexpr(64)


@triton.jit
def begin_call(ctx):
    """This program's call number n (>= 1) for the call that is starting (program 0 also
    opens the rank's call record: ``cl.record_begin``)."""
    cl.record_begin(ctx)
    return tl.load(cl.flags(ctx) + tl.program_id(0)) + 1


@triton.jit
def end_call(ctx, n):
    tl.store(cl.flags(ctx) + tl.program_id(0), n)
    cl.record_end(ctx)


@triton.jit
def _slot(ctx, src, bank):
    return cl.flags(ctx) + SLOTS + bank * BANK + tl.program_id(0) * WIDTH + src


@triton.jit
def signal(ctx, peer, value, bank=0):
    """Release: our earlier stores (local or remote) are visible to ``peer``'s same
    program once it sees ``value`` in its slot for us."""
    cl.notify(_slot(ctx, tl.load(ctx), bank), peer, ctx, value, sig_op="set")


@triton.jit
def wait_from(ctx, src, value, bank=0):
    """Acquire: returns once rank ``src``'s same program signalled ``value`` or more."""
    cl.wait(_slot(ctx, src, bank), value, ctx)


@triton.jit
def signal_all(ctx, value, bank=0):
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    for i in range(1, world):
        signal(ctx, (me + i) % world, value, bank)


@triton.jit
def wait_all(ctx, value, bank=0):
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    for i in range(1, world):
        wait_from(ctx, (me + i) % world, value, bank)
    cl.record_arrived(ctx)  # the first completed wait for every peer: they all arrived


@triton.jit
def ack_all(ctx, value, bank=0):
    """Tell every peer's same program we are done *reading* what it sent (a write-after-
    read acknowledgement), without signal()'s release fence. Safe because every load
    of this block whose value we used has completed: its value fed a store that the
    thread issued before the block barrier below. Saves a system-scope fence on the
    critical path of kernels that end with an acknowledgement (broadcast)."""
    tl.debug_barrier()
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    for i in range(1, world):
        peer = (me + i) % world
        remote = cl.symm_at(_slot(ctx, me, bank), peer, ctx)
        tl.atomic_xchg(remote, value, sem="relaxed", scope="sys")


@triton.jit
def my_blocks(n_elems, BLOCK: tl.constexpr):
    """How many BLOCK-sized blocks of ``n_elems`` this program handles (blocks are dealt
    round-robin: program p takes p, p + P, p + 2P, …)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblk = tl.cdiv(n_elems, BLOCK)
    return tl.maximum(nblk - pid + nprog - 1, 0) // nprog
