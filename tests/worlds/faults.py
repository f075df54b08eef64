"""Rank functions for tests/test_reliability.py: allocation loops whose frees land at
rank-dependent moments (cyclic garbage, rank-dependent Python work) and failed allocations."""

from __future__ import annotations

import gc

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from commlab.errors import RankMismatchError


@triton.jit
def _ping_kernel(buf_ptr, flag_ptr, ctx, BLOCK: tl.constexpr):
    me, world = cl.rank(ctx), cl.num_ranks(ctx)
    right = (me + 1) % world
    offs = tl.arange(0, BLOCK)
    tl.store(cl.symm_at(buf_ptr + offs, right, ctx), tl.zeros((BLOCK,), tl.float32) + me)
    cl.notify(flag_ptr, right, ctx, 1, sig_op="add")
    cl.wait(flag_ptr, 1)


class _Cycle:
    """Holds a tensor from a reference cycle: freed only when the cyclic GC runs."""

    def __init__(self, t):
        self.t, self.me = t, self


def ping_loop_world(comm, iters: int = 30) -> dict:
    """The README's ping in a loop; each iteration's blocks die inside reference cycles and
    rank 0 does extra Python work, so the cyclic GC runs at different moments per rank."""
    gc.set_threshold(50, 5, 5)
    left = (comm.rank - 1) % comm.world_size
    for i in range(iters):
        buf = commlab.symmetric_zeros((128,))
        flag = commlab.symmetric_zeros((1,), dtype=torch.int32)
        _ping_kernel[(1,)](buf, flag, comm.context, BLOCK=128)
        assert torch.all(buf == left), (i, buf[:4])
        _Cycle(buf), _Cycle(flag)
        del buf, flag
        if comm.rank == 0:
            junk = [[j] for j in range(200)]  # rank-dependent allocations drive the GC
            for j in junk:
                j.append(j)
            print(f"iteration {i}", flush=True) if i % 10 == 0 else None
    return {"iters": iters}


def failed_allocation_world(comm) -> dict:
    """A symmetric_zeros whose shape differs across ranks, its error kept alive (as IPython
    keeps sys.last_traceback), then a correct allocation."""
    kept = None
    try:
        commlab.symmetric_zeros((64 + 64 * comm.rank,))
    except RankMismatchError as e:
        kept = e  # the traceback lives on, with its frames
    t = commlab.symmetric_zeros((32,))
    return {"error": str(kept), "ok": tuple(t.shape), "tb": kept.__traceback__ is not None}


def killed_inside_kernel_world(comm) -> dict:
    """Rank 1 is SIGKILLed after allocating; rank 0's kernel waits for its signal."""
    import os
    import signal
    import time

    buf = commlab.symmetric_zeros((128,))
    flag = commlab.symmetric_zeros((1,), dtype=torch.int32)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    _ping_kernel[(1,)](buf, flag, comm.context, BLOCK=128)  # raises: rank 1 is dead
    return {}


def _own_listeners() -> list[tuple[str, int]]:
    """(address hex, port) of every socket this process listens on (/proc/net/tcp{,6})."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(path).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                addr, port = f[1].split(":")
                out.append((addr, int(port, 16)))
    return out


def listeners_world(comm) -> dict:
    import os

    return {"port": int(os.environ["MASTER_PORT"]), "listening": _own_listeners()}


@triton.jit
def _store_at_peer_kernel(t_ptr, peer, ctx):
    tl.store(cl.symm_at(t_ptr, peer, ctx), 1.0)


def bad_symm_at_world(comm) -> dict:
    """symm_at with a peer outside the world, then with an ordinary (non-heap) tensor."""
    t = commlab.symmetric_zeros((4,))
    out = {}
    for name, args in (("peer", (t, comm.world_size + 3)), ("pointer", (torch.zeros(4), 0))):
        try:
            _store_at_peer_kernel[(1,)](args[0], args[1], comm.context)
            out[name] = ""
        except Exception as e:  # noqa: BLE001 - the interpreter wraps it; the text decides
            out[name] = f"{type(e).__name__}: {e}"
    return out
