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
base_0 … base_{W-1}]`` where ``base_r`` is rank r's heap base *as mapped in this
process*. ``symm_at`` moves a pointer by ``base_peer − base_me``, so it works for any
pointer into the symmetric heap, scalar or block, on both backends.

One source, two worlds: under Triton's interpreter (CPU backend) every spin loop yields
the core to the other ranks (``INTERPRET`` is a compile-time constant, so the compiled
GPU code never contains that branch).
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import triton
import triton.language as tl

from commlab import _interp_fast, _interpret
from commlab.runtime import heap as _heap

INTERPRET = tl.constexpr(_interpret.interpreting())
MAX_WORLD = tl.constexpr(_heap.MAX_WORLD)  # signal-pad row width, from the heap layout
CTX_BASES = tl.constexpr(4)  # ctx[4 + r] = base of rank r's heap


def _fast_nested_calls() -> None:
    """Interpreter speed-up: skip re-patching triton.language on nested jit calls.

    Triton's interpreter patches ``triton.language`` when a launch starts and, again,
    on *every* call of one @triton.jit function from another (``cl.symm_at``,
    ``cl.wait``… inside a kernel's loops) — 36-46% of a CPU all-reduce's time, measured
    with cProfile. Here a nested call patches only the first time, per launch, that a
    helper names a language module (``triton.language`` or ``triton.language.core``)
    not yet patched in this launch; later calls skip it. Applied only when the interpreter has
    the shape this was written against (Triton 3.x); ``COMMLAB_INTERPRETER_FASTCALL=0``
    turns it off.
    """
    import threading

    from triton.runtime import interpreter as ti

    fn_cls, grid_cls = getattr(ti, "InterpretedFunction", None), getattr(ti, "GridExecutor", None)
    if (fn_cls is None or grid_cls is None or not hasattr(fn_cls, "rewrite")
            or not hasattr(ti, "_patch_lang") or getattr(fn_cls.__call__, "_commlab", False)
            or os.environ.get("COMMLAB_INTERPRETER_FASTCALL", "1") == "0"):
        return
    depth = threading.local()
    grid_call, nested_call = grid_cls.__call__, fn_cls.__call__
    langs = (tl, tl.core)

    def launch(self, *args, **kwargs):
        saved = getattr(depth, "patched", None)
        depth.n = getattr(depth, "n", 0) + 1
        depth.patched = set()  # language modules patched during this launch
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            depth.n -= 1
            depth.patched = saved

    def call(self, *args, **kwargs):
        if getattr(depth, "n", 0) == 0:
            return nested_call(self, *args, **kwargs)
        mods = getattr(self, "_commlab_langs", None)
        if mods is None:  # which language modules this helper's globals name
            mods = self._commlab_langs = frozenset(
                id(v) for v in self.fn.__globals__.values() if any(v is m for m in langs))
        if not mods <= depth.patched:  # first helper of this launch seeing these modules
            ti._patch_lang(self.fn)
            depth.patched |= mods
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    call._commlab = True
    grid_cls.__call__, fn_cls.__call__ = launch, call


if _interpret.interpreting():
    _fast_nested_calls()
    _interp_fast.install()  # symbolic index blocks, slice-copy loads and stores
    _spin = [0, 0.0]  # consecutive spins, time of the last one

    def _host_yield():
        """Interpreter: give the core to the ranks we wait for. Ranks often outnumber
        cores (4 ranks on a 2-core laptop or CI box), so after a short burst of
        sched_yield the waiter sleeps, progressively longer, instead of spinning."""
        now = time.perf_counter()
        if now - _spin[1] > 0.005:  # a new wait began
            _spin[0] = 0
        _spin[1] = now
        _spin[0] += 1
        if _spin[0] < 20:
            os.sched_yield()
        else:
            time.sleep(0.0001 if _spin[0] < 200 else 0.0005)

    def _host_wait(ptr, value):
        """Interpreter: wait for the int32 at ``ptr`` to reach ``value`` reading it
        straight from memory (a microsecond a look, against ~100 us for an interpreted
        atomic, and no CPU taken from the ranks we wait for). A hint only: it gives up
        after 2 ms, and the caller's atomic re-reads the flag (acquire) either way."""
        addr, want = ptr.handle.data, getattr(value, "handle", None)
        want = want.data if want is not None else np.asarray(getattr(value, "value", value))
        if addr.size != 1 or want.size != 1:
            return _host_yield()
        cell, want = ctypes.c_int32.from_address(int(addr.flat[0])), int(want.flat[0])
        give_up, spin = time.perf_counter() + 0.002, 0
        while cell.value < want and time.perf_counter() < give_up:
            if spin < 10:
                os.sched_yield()
            else:
                time.sleep(0.00005)
            spin += 1

else:

    @triton.jit
    def _host_yield():  # compiled: never reached (INTERPRET is False), but Triton's
        pass  # dependency scan still resolves the name, so it must be a jit function

    @triton.jit
    def _host_wait(ptr, value):  # compiled: never reached either
        pass


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
    me = tl.load(ctx)
    delta = tl.load(ctx + CTX_BASES + peer) - tl.load(ctx + CTX_BASES + me)
    byte_ptr = ptr.to(tl.pointer_type(tl.int8), bitcast=True)
    return (byte_ptr + delta).to(ptr.dtype, bitcast=True)


# --- point-to-point signals -------------------------------------------------------


@triton.jit
def notify(ptr, peer, ctx, value, sig_op: tl.constexpr = "set"):
    """Signal ``peer``: write (``set``) or add (``add``) ``value`` to the int32 at the
    symmetric location ``ptr`` on ``peer``. Release, system scope: every store this
    block made before the call is visible to ``peer`` once it sees the signal."""
    tl.static_assert(sig_op == "set" or sig_op == "add", "notify: sig_op must be 'set' or 'add'")
    tl.debug_barrier()  # all threads' stores precede the release
    remote = symm_at(ptr, peer, ctx)
    if sig_op == "set":
        tl.atomic_xchg(remote, value, sem="release", scope="sys")
    else:
        tl.atomic_add(remote, value, sem="release", scope="sys")


@triton.jit
def wait(ptr, value):
    """Spin until the int32 at local ``ptr`` is >= ``value`` (acquire, system scope):
    what the signaller stored before notifying is visible after this returns."""
    while tl.atomic_add(ptr, 0, sem="acquire", scope="sys") < value:
        if INTERPRET:
            _host_wait(ptr, value)
    tl.debug_barrier()  # no thread reads before the acquire completed


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
        while tl.atomic_cas(remote, 0, 1, sem="release", scope="sys") != 0:
            if INTERPRET:
                _host_yield()
    for i in range(1, world):
        peer = (me + i) % world
        while tl.atomic_cas(row + peer, 1, 0, sem="acquire", scope="sys") != 1:
            if INTERPRET:
                _host_yield()
    tl.debug_barrier()


@triton.jit
def flags(ctx):
    """int32 pointer to this communicator's flag area (collectives keep counters there)."""
    return tl.load(ctx + 3).to(tl.pointer_type(tl.int32))


__all__ = ["rank", "num_ranks", "symm_at", "notify", "wait", "barrier", "flags", "INTERPRET"]

