"""commlab's device language: primitives used inside ``@triton.jit`` kernels.

    import commlab.language as cl

    @triton.jit
    def kernel(x_ptr, flag_ptr, ctx, ...):
        me = cl.rank(ctx); world = cl.num_ranks(ctx)
        peer_x = cl.symm_at(x_ptr, (me + 1) % world, ctx)   # same location, next rank
        cl.notify(flag_ptr, peer, ctx, 1, sig_op="add")       # release, system scope
        cl.wait(flag_ptr, 1)                                  # acquire: int32 at ptr >= 1
        cl.barrier(ctx)                                       # blockwise, all ranks

``ctx`` is ``comm.context``: an int64 tensor ``[rank, world, signal_pad, flags,
base_0 … base_{W-1}, wait_records]`` where ``base_r`` is rank r's heap base *as mapped
in this process* and ``wait_records`` the address of the wait records (GPU; 0 on CPU). ``symm_at`` moves a pointer by ``base_peer − base_me``, so it works for any
pointer into the symmetric heap, scalar or block, on both backends.

One source, two worlds: under Triton's interpreter (CPU backend) every spin loop yields
the core to the other ranks (``commlab._interpreter.host``); ``INTERPRET`` is a
compile-time constant, so the compiled GPU code never contains that branch.
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

from commlab import _config, _interpreter
from commlab._interpreter.bounds import host_check_symm as _host_check_symm
from commlab._interpreter.host import host_wait as _host_wait
from commlab._interpreter.host import host_wait_begin as _host_wait_begin
from commlab._interpreter.host import host_yield as _host_yield
from commlab.runtime import heap as _heap
from commlab.runtime import records as _call_records
from commlab.runtime import wait_records as _wait_records

INTERPRET = tl.constexpr(_interpreter.interpreting())
MAX_WORLD = tl.constexpr(_heap.MAX_WORLD)  # signal-pad row width, from the heap layout
CTX_BASES = tl.constexpr(4)  # ctx[4 + r] = base of rank r's heap
WAIT_SLOTS = tl.constexpr(_wait_records.SLOTS)  # programs with a wait record (GPU)
ABORT_WORD = tl.constexpr(_wait_records.ABORT)  # the host's abort word in the records
CHECK_EVERY = tl.constexpr(_wait_records.CHECK_EVERY)  # spins between two looks at it
ABORT_CHECK = tl.constexpr(_config.get("COMMLAB_GPU_ABORT"))  # GPU spins look at it at all
RECORDS = tl.constexpr(_call_records.enabled())  # call records (COMMLAB_RECORDS, read at import)
_REC_OFFSET = tl.constexpr(_heap.RECORD_OFFSET)  # bytes from the flag area to the records
_REC_RING = tl.constexpr(_heap.RECORD_RING)
_REC_STAMPS = tl.constexpr(_heap.RECORD_STAMPS)


if INTERPRET:

    def _host_ns():  # the interpreter's clock: the machine's, the same in every process
        return time.monotonic_ns()

else:

    @triton.jit
    def _host_ns():  # compiled: never reached; jit so the dependency scan resolves it
        return 0


# --- who am I ---------------------------------------------------------------------


@triton.jit
def rank(ctx):
    """This rank's index (int32)."""
    return tl.load(ctx).to(tl.int32)


@triton.jit
def num_ranks(ctx):
    """Number of ranks in the world (int32)."""
    return tl.load(ctx + 1).to(tl.int32)


# --- addressing -------------------------------------------------------------------


@triton.jit
def symm_at(ptr, peer, ctx):
    """The address of the same symmetric location (``ptr``) in ``peer``'s heap."""
    if INTERPRET:
        _host_check_symm(ptr, peer, ctx)
    me = tl.load(ctx)
    delta = tl.load(ctx + CTX_BASES + peer) - tl.load(ctx + CTX_BASES + me)
    byte_ptr = ptr.to(tl.pointer_type(tl.int8), bitcast=True)
    return (byte_ptr + delta).to(ptr.dtype, bitcast=True)


# --- point-to-point signals -------------------------------------------------------


@triton.jit
def notify(ptr, peer, ctx, value, sig_op: tl.constexpr = tl.constexpr("set")):
    """Signal ``peer``: write (``set``) or add (``add``) ``value`` to the int32 at the
    symmetric location ``ptr`` on ``peer``. Release, system scope: every store this
    block made before the call is visible to ``peer`` once it sees the signal.
    (The default is a constexpr object: Triton 3.6 turns a plain string default of a
    called jit function into a runtime argument and fails to compile it.)"""
    tl.static_assert(sig_op == "set" or sig_op == "add", "notify: sig_op must be 'set' or 'add'")
    tl.debug_barrier()  # all threads' stores precede the release
    remote = symm_at(ptr, peer, ctx)
    if sig_op == "set":
        tl.atomic_xchg(remote, value, sem="release", scope="sys")
    else:
        tl.atomic_add(remote, value, sem="release", scope="sys")


@triton.jit
def wait(ptr, value, ctx=None):
    """Spin until the int32 at local ``ptr`` is >= ``value`` (acquire, system scope):
    what the signaller stored before notifying is visible after this returns.

    ``ctx`` (optional; commlab's own kernels pass it): on a GPU, a wait whose first look
    fails records (flag address, value) in its program's slot of the wait records, host
    memory the hang report reads while the kernel spins, and clears it when satisfied:
    two stores before the spin, one after, none on a wait satisfied at once. The spin
    also loads the host's abort word every CHECK_EVERY spins and gives up once it is set
    (a rank was lost: the host raises RankLostError; what the kernel computed is void),
    when ``COMMLAB_GPU_ABORT=1`` (off by default until checked on a GPU).
    Without ``ctx`` a GPU wait has no way out. On the CPU backend every wait is seen by
    the host anyway (``commlab._interpreter.blocked``)."""
    if INTERPRET:
        _host_wait_begin(ptr, value)
        while tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value:
            _host_wait(ptr, value)
    elif ctx is None:
        while tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value:
            pass
    else:
        if tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value:
            slot, ok = _wait_slot(ctx)
            tl.store(slot + 1, tl.cast(value, tl.int64), mask=ok, cache_modifier=".wt")
            tl.store(slot, ptr.to(tl.int64, bitcast=True), mask=ok, cache_modifier=".wt")
            if ABORT_CHECK:
                abort = _abort_word(ctx)
                go = tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value
                spins = 0
                while go:
                    spins += 1
                    go = tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value
                    if spins % CHECK_EVERY == 0:
                        go = go & (tl.load(abort, volatile=True) == 0)
            else:
                while tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value:
                    pass
            tl.store(slot, tl.cast(0, tl.int64), mask=ok, cache_modifier=".wt")
    tl.debug_barrier()  # no thread reads before the acquire completed


@triton.jit
def _abort_word(ctx):
    """The host's abort word (int64, pinned host memory) after the wait records, whose
    address is ctx[CTX_BASES + world] (GPU only: non-zero there)."""
    world = tl.load(ctx + 1)
    recs = tl.load(ctx + CTX_BASES + world)
    return recs.to(tl.pointer_type(tl.int64)) + ABORT_WORD


@triton.jit
def _spin_cas(ptr, cmp, val, abort, SEM: tl.constexpr):
    """Compiled code only: CAS ``ptr`` from ``cmp`` to ``val`` until it succeeds, or the
    abort word (looked at every CHECK_EVERY tries) is set."""
    go = tl.atomic_cas(ptr, cmp, val, sem=SEM, scope="sys") != cmp
    spins = 0
    while go:
        spins += 1
        go = tl.atomic_cas(ptr, cmp, val, sem=SEM, scope="sys") != cmp
        if ABORT_CHECK:
            if spins % CHECK_EVERY == 0:
                go = go & (tl.load(abort, volatile=True) == 0)


@triton.jit
def _wait_slot(ctx):
    """This program's wait record (int64 [address, value]) and whether it has one: the
    records' address is ctx[CTX_BASES + world] (0: none), one slot per program id."""
    world = tl.load(ctx + 1)
    recs = tl.load(ctx + CTX_BASES + world)
    pid = _pid_flat()
    slot = recs.to(tl.pointer_type(tl.int64)) + 2 * pid
    return slot, (recs != 0) & (pid < WAIT_SLOTS)


# --- barrier ----------------------------------------------------------------------
# Blockwise barrier: program p of every rank meets program p of every other rank.
# Slot (p, src) of rank dst's signal pad is a one-bit mailbox: src CAS-es it 0 -> 1
# on dst (spinning while dst has not yet consumed the previous signal), and dst
# CAS-es it 1 -> 0 when it consumes it. Mailboxes reset themselves, so consecutive
# barriers and kernels need no host bookkeeping. On return, every store any rank's
# program p made before the barrier is visible to program p everywhere.


@triton.jit
def _pid_flat():
    return (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def barrier(ctx):
    """Blockwise barrier across all ranks (see the comment above). Programs with the
    same id must call it the same number of times on every rank; at most 256 programs."""
    tl.debug_barrier()
    me = tl.load(ctx).to(tl.int32)
    world = tl.load(ctx + 1).to(tl.int32)
    pad = tl.load(ctx + 2).to(tl.pointer_type(tl.int32))
    row = pad + _pid_flat() * MAX_WORLD
    for i in range(1, world):
        peer = (me + i) % world
        remote = symm_at(row + me, peer, ctx)
        if INTERPRET:
            while tl.atomic_cas(remote, 0, 1, sem="release", scope="sys") != 0:
                _host_yield(remote, 0)
        else:  # gives up when the host sets the abort word (a rank was lost)
            _spin_cas(remote, 0, 1, _abort_word(ctx), "release")
    for i in range(1, world):
        peer = (me + i) % world
        if INTERPRET:
            while tl.atomic_cas(row + peer, 1, 0, sem="acquire", scope="sys") != 1:
                _host_yield(row + peer, 1)
        else:
            _spin_cas(row + peer, 1, 0, _abort_word(ctx), "acquire")
    tl.debug_barrier()


# --- clocks and call records ---------------------------------------------------------
# Each rank's flag area ends with its call records (commlab.runtime.records): int64
# [count, ...7 spare] then a ring of [call, entry, arrived, end] and user stamps. Program
# 0 of a recording kernel writes them; kernels of one rank run in order, so no atomics.


@triton.jit
def clock():
    """Nanoseconds now: ``%globaltimer`` on NVIDIA GPUs (one clock per node), the host's
    monotonic clock under the interpreter (one clock per machine)."""
    if INTERPRET:
        now = _host_ns()
    else:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [],
                                        dtype=tl.int64, is_pure=False, pack=1)
    return now


@triton.jit
def _records(ctx):
    base = tl.load(ctx + 3).to(tl.pointer_type(tl.int8)) + _REC_OFFSET
    return base.to(tl.pointer_type(tl.int64), bitcast=True)


@triton.jit
def timestamp(ctx, slot):
    """Store ``clock()`` in user stamp ``slot`` (0..63) of this rank's records; the host
    reads them with ``commlab.runtime.records.stamps(comm)``. Any program may call it."""
    off = tl.cast(slot, tl.int64) % _REC_STAMPS
    tl.store(_records(ctx) + 8 + 4 * _REC_RING + off, clock())


@triton.jit
def record_begin(ctx):
    """Open this rank's next call record (program 0; call once per launch, at entry):
    the entry time now, arrival and end to come."""
    if RECORDS:
        if _pid_flat() == 0:
            rec = _records(ctx)
            k = tl.load(rec) + 1
            slot = rec + 8 + 4 * ((k - 1) % _REC_RING)
            tl.store(slot + 2, tl.cast(0, tl.int64))
            tl.store(slot + 3, tl.cast(0, tl.int64))
            tl.store(slot + 1, clock())
            tl.store(slot, k)
            tl.store(rec, k)


@triton.jit
def record_arrived(ctx):
    """Stamp, once per record, the moment every peer's arrival was seen (program 0's
    first completed wait for all peers)."""
    if RECORDS:
        if _pid_flat() == 0:
            rec = _records(ctx)
            k = tl.load(rec)
            slot = rec + 8 + 4 * ((k - 1) % _REC_RING)
            if tl.load(slot + 2) == 0:
                tl.store(slot + 2, clock())


@triton.jit
def record_end(ctx):
    """Close this rank's current call record (program 0, last thing it does)."""
    if RECORDS:
        if _pid_flat() == 0:
            tl.debug_barrier()
            rec = _records(ctx)
            k = tl.load(rec)
            tl.store(rec + 8 + 4 * ((k - 1) % _REC_RING) + 3, clock())


@triton.jit
def flags(ctx):
    """int32 pointer to this communicator's flag area (collectives keep counters there)."""
    return tl.load(ctx + 3).to(tl.pointer_type(tl.int32))


__all__ = ["rank", "num_ranks", "symm_at", "notify", "wait", "barrier", "flags", "INTERPRET",
           "clock", "timestamp", "record_begin", "record_arrived", "record_end"]

