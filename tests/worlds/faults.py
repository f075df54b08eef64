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


# --- the standing fault suite (tests/test_faults.py): one world, every section ----------


def _mixed_call(i: int, gen: torch.Generator, world: int):
    """Collective number ``i`` of the mixed run: (name, commlab call, gloo reference)."""
    import torch.distributed as dist

    from tests.worlds._checks import GLOO_OPS

    kind = int(torch.randint(0, 6, (1,), generator=gen))
    n = world * int(torch.randint(1, 40, (1,), generator=gen))
    dtype = torch.int32 if i % 2 else torch.float32
    me = dist.get_rank()
    x = (torch.arange(n, dtype=torch.float32) * (me + 1) + i).to(dtype)
    if kind <= 2:
        op = ("sum", "max", "min")[kind]

        def ref_all_reduce():
            r = x.clone()
            dist.all_reduce(r, op=GLOO_OPS[op])
            return r
        return f"all_reduce {op}", lambda: commlab.all_reduce(x, op=op), ref_all_reduce
    if kind == 3:
        def ref_all_gather():
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x)
            return torch.cat(parts)
        return "all_gather", lambda: commlab.all_gather(x), ref_all_gather
    if kind == 4:
        def ref_reduce_scatter():
            r = x.clone()
            dist.all_reduce(r)
            return r.chunk(world)[me]
        return "reduce_scatter", lambda: commlab.reduce_scatter(x), ref_reduce_scatter
    src = i % world

    def ref_broadcast():
        r = x.clone()
        dist.broadcast(r, src=src)
        return r
    return f"broadcast src={src}", lambda: commlab.broadcast(x, src=src), ref_broadcast


def fault_suite_world(comm, calls: int = 250, seed: int = 17) -> dict:
    """Bad inputs on one rank and on all, a rank stopped then continued, ``calls`` mixed
    collectives with random stragglers against gloo, allocation loops under GC pressure
    with rank-dependent Python work. Returns the checks and this rank's pid."""
    import os
    import random
    import signal
    import time

    import torch.distributed as dist

    from tests.worlds._checks import Checks

    checks = Checks(comm.rank)
    rank, world = comm.rank, comm.world_size
    x = torch.ones(4 * world)

    def expect(section, label, call, needles, mismatch):
        with checks.case(section, label):
            try:
                call()
            except commlab.CommlabUsageError as e:
                assert isinstance(e, commlab.RankMismatchError) == mismatch, repr(e)
                missing = [w for w in needles if w not in str(e)]
                assert not missing, f"{missing} not in {e}"
            else:
                raise AssertionError("no error raised")
            out = commlab.all_reduce(torch.ones(7))  # in step: the next call works
            assert torch.equal(out, torch.full((7,), float(world))), out

    one = rank == world - 1
    expect("bad_inputs", "unknown keyword on one rank",
           lambda: commlab.all_reduce(x, **({"opp": "max"} if one else {})),
           [f"on rank {world - 1}: TypeError", "'opp'"], True)
    expect("bad_inputs", "bad dtype on one rank",
           lambda: commlab.all_gather(x.double() if one else x), ["float64"], True)
    expect("bad_inputs", "bad op on every rank", lambda: commlab.reduce_scatter(x, op="avg"),
           ["reduce_scatter: op must be one of", "'avg'"], False)
    expect("bad_inputs", "negative shape on one rank",
           lambda: commlab.symmetric_empty((-1 if one else 4,)), ["non-negative"], True)
    expect("bad_inputs", "algorithm=None on every rank",
           lambda: commlab.all_reduce(x, algorithm=None), ["got None"], False)

    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    with checks.case("stopped_rank", "a rank stopped for 1 s, then continued"):
        if rank == 0:
            time.sleep(0.3)  # the others are inside the all_reduce below, waiting
            for p in pids[1:]:
                os.kill(p, signal.SIGSTOP)
            time.sleep(1.0)
            for p in pids[1:]:
                os.kill(p, signal.SIGCONT)
        out = commlab.all_reduce(torch.full((33,), float(rank)))
        assert torch.equal(out, torch.full((33,), float(sum(range(world))))), out

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed * 31 + rank)  # stragglers differ by rank
    for i in range(calls):
        name, call, ref = _mixed_call(i, gen, world)
        with checks.case("stragglers", f"#{i} {name}"):
            if rng.random() < 0.2:
                time.sleep(rng.random() * 0.01)
            out = call()
            want = ref()
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

    with checks.case("gc_pressure", "allocation loop, cyclic garbage, rank-dependent work"):
        import gc

        gc.set_threshold(30, 3, 3)
        for i in range(25):
            t = commlab.symmetric_zeros((64 + i,))
            t += rank + 1
            _Cycle(t)
            del t
            if rank == 0:
                junk = [[j] for j in range(300)]
                for j in junk:
                    j.append(j)
            u = commlab.symmetric_zeros((16,), dtype=torch.int32)
            out = commlab.all_reduce(torch.full((9,), float(i)))
            assert torch.equal(out, torch.full((9,), float(i * world))), (i, out)
            del u
        gc.set_threshold(700, 10, 10)
    return {**checks.result(), "pid": os.getpid()}


def killed_rank_world(comm, note_dir: str) -> dict:
    """Each rank notes its pid in ``note_dir``; then rank 1 is killed inside a kernel
    wait of rank 0's (as ``killed_inside_kernel_world``)."""
    import os

    with open(os.path.join(note_dir, f"rank{comm.rank}"), "w") as f:
        f.write(str(os.getpid()))
    return killed_inside_kernel_world(comm)


@triton.jit
def _signal_kernel(flag_ptr, ctx, TO: tl.constexpr):
    cl.notify(flag_ptr, TO, ctx, 1, sig_op="add")


@triton.jit
def _wait_kernel(flag_ptr, want, ctx):
    cl.wait(flag_ptr, want, ctx)


def finished_rank_world(comm, signals: bool) -> dict:
    """Rank 0's kernel waits for a signal from each of ranks 1 and 2. Rank 2 sends its own
    (or, ``signals`` False, none) and its process ends at once; rank 1 sends only once
    rank 2's process is gone and rank 0 has waited beside its absence for a while."""
    import time

    from commlab.runtime.membership import alive

    flag = commlab.symmetric_zeros((1,), dtype=torch.int32)
    if comm.rank == 0:
        t0 = time.monotonic()
        _wait_kernel[(1,)](flag, 2, comm.context)
        return {"flag": int(flag.item()), "waited": time.monotonic() - t0}
    if comm.rank == 2:
        if signals:
            _signal_kernel[(1,)](flag, comm.context, TO=0)
        return {}
    pid, deadline = comm.members.pids[2], time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    gone = not alive(pid)
    time.sleep(0.5)  # rank 0's wait looks at the members ten times meanwhile
    _signal_kernel[(1,)](flag, comm.context, TO=0)
    return {"rank 2 gone first": gone}
