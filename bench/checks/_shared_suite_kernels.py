"""Rank function of gpu_shared_suite.py's "kernels" world: user kernels written with
commlab.language (the README's ring ping, a blockwise-barrier gather), a planted hang
seen in the wait-for graph and released by a peer's kernel, then the overlapped GEMMs
against torch.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from _shared_suite_common import Tally, assert_bf16_close, gloo_all_gather, gloo_all_reduce, sync

import commlab
import commlab.language as cl

# --- user kernels ---------------------------------------------------------------------


@triton.jit
def ping_kernel(buf_ptr, flag_ptr, ctx, value, round_no, BLOCK: tl.constexpr):
    """The README's ping: write ``value`` into the right neighbour's buffer, tell it."""
    me, world = cl.rank(ctx), cl.num_ranks(ctx)
    right = (me + 1) % world
    offs = tl.arange(0, BLOCK)
    tl.store(cl.symm_at(buf_ptr + offs, right, ctx), tl.zeros((BLOCK,), tl.float32) + value)
    cl.notify(flag_ptr, right, ctx, 1, sig_op="add")  # release: the store above is visible
    cl.wait(flag_ptr, round_no)  # acquire: our left neighbour's store of this round landed


@triton.jit
def gather_kernel(x_ptr, out_ptr, ctx, N, BLOCK: tl.constexpr):
    """Program p pushes block p of x into slot ``me`` of every rank's out, then meets
    program p of every rank: after the barrier, block p of every slot here has landed."""
    p = tl.program_id(0)
    me, world = cl.rank(ctx), cl.num_ranks(ctx)
    offs = p * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    v = tl.load(x_ptr + offs, mask=mask)
    for peer in range(0, world):
        tl.store(cl.symm_at(out_ptr + me * N + offs, peer, ctx), v, mask=mask)
    cl.barrier(ctx)


def check_user_kernels(comm, t: Tally, gen) -> None:
    w, me = comm.world_size, comm.rank
    buf = commlab.symmetric_zeros((128,), torch.float32)
    flag = commlab.symmetric_zeros((1,), torch.int32)
    commlab.barrier()
    for rnd in (1, 2, 3):
        ping_kernel[(1,)](buf, flag, comm.context, float(100 * rnd + me), rnd, BLOCK=128)
        sync(comm)
        with t.check(f"user kernel: ring ping round {rnd}"):
            want = float(100 * rnd + (me - 1) % w)
            got = buf.cpu()
            if not bool((got == want).all()):
                raise AssertionError(f"buffer holds {got[:4].tolist()}..., expected the left "
                                     f"neighbour's {want}")
        commlab.barrier()  # everyone read this round before the next one's stores land
    n = 1000  # not a multiple of the block: masked tails
    x = torch.randn(n, generator=gen).to(comm.device)
    out = commlab.symmetric_zeros((w * n,), torch.float32)
    commlab.barrier()
    gather_kernel[(triton.cdiv(n, 128),)](x, out, comm.context, n, BLOCK=128)
    sync(comm)
    ref = gloo_all_gather(comm, x)
    with t.check("user kernel: blockwise-barrier gather (8 programs)"):
        torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)
    commlab.barrier()


# --- a planted hang -----------------------------------------------------------------


@triton.jit
def stuck_kernel(flag_ptr, ctx):
    """Waits for flag[0] >= 1, which nobody sets until the check releases it."""
    cl.wait(flag_ptr, 1, ctx)
    tl.store(flag_ptr + 2, 7)  # proof that it ran past the wait


@triton.jit
def release_kernel(flag_ptr, ctx):
    """Waits for the host's go (flag[1] >= 1 here), then notifies rank 0's flag[0]."""
    cl.wait(flag_ptr + 1, 1, ctx)
    cl.notify(flag_ptr, 0, ctx, 1, sig_op="set")


def _until(cond, limit: float):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    return None


def _watch(comm, flag, seen: dict, limit: float, side=None, one=None) -> None:
    """On rank 0, while stuck_kernel spins: read the blocked waits (and on GPUs the
    records), then tell rank 1's release_kernel to go (a host write into its flag[1]).
    On GPUs ``side`` and ``one`` are made before the kernel starts: creating a CUDA stream
    while a kernel of this process spins blocked until the kernel ended (one H200, driver
    580, torch 2.11), and a device-to-device copy needs no kernel module loaded then."""
    from commlab.racecheck import blocked_waits, wait_graph_text
    from commlab.runtime import wait_records
    from commlab.runtime.peer import peer_view

    names = {"flag": flag}
    nodes = _until(lambda: [n for n in blocked_waits(names) if n.get("flag") == "flag[0]"],
                   limit)
    seen["nodes"] = nodes or []
    seen["text"] = wait_graph_text(blocked_waits(names), comm.world_size)
    if comm.backend == "cuda":
        seen["records"] = wait_records.now(comm)
    try:
        go = peer_view(comm, flag, 1)
        if comm.backend == "cuda":
            with torch.cuda.stream(side):  # beside the spinning kernel
                go[1:2].copy_(one)
            side.synchronize()
        else:
            go[1] = 1
    except Exception as e:  # no go for the peer: release our own kernel, say why
        seen["go_error"] = f"{type(e).__name__}: {e}"
        if comm.backend == "cpu":
            flag[0] = 1


def check_hang(comm, t: Tally) -> None:
    """Rank 0's kernel waits on a flag nobody sets; rank 0 names it from the blocked
    waits, rank 1's kernel releases it with cl.notify, and the world is usable after."""
    w, me = comm.world_size, comm.rank
    flag = commlab.symmetric_zeros((4,), torch.int32)
    commlab.barrier()
    seen: dict = {}
    limit = 20.0 if comm.backend == "cuda" else 40.0
    released = True
    if me == 0:
        if comm.backend == "cuda":
            done = torch.cuda.Event()
            side = torch.cuda.Stream(comm.device)  # made now: not while the kernel spins
            one = torch.ones(1, dtype=torch.int32, device=comm.device)
            with torch.cuda.stream(side):  # the copy path, once, before the spin
                one.copy_(one)
            side.synchronize()
            stuck_kernel[(1,)](flag, comm.context)
            done.record()
            _watch(comm, flag, seen, limit, side, one)
            released = bool(_until(done.query, limit))
            if not released:  # unstick it ourselves so the world can go on
                with torch.cuda.stream(side):
                    flag[0:1].copy_(one)
                _until(done.query, limit)
        else:  # the interpreter runs the kernel in this thread: watch from another
            watcher = threading.Thread(target=_watch, args=(comm, flag, seen, limit))
            watcher.start()
            stuck_kernel[(1,)](flag, comm.context)
            watcher.join()
    elif me == 1:
        release_kernel[(1,)](flag, comm.context)
    sync(comm)
    if me == 0:
        print("  wait-for graph while rank 0 spun:\n    "
              + seen.get("text", "").replace("\n", "\n    "), flush=True)
    with t.check("planted hang: the blocked wait is named (program, flag, value)"):
        if me == 0:
            nodes = seen.get("nodes") or []
            if len(nodes) != 1:
                raise AssertionError(f"expected one blocked wait on flag[0], got {nodes}; "
                                     f"graph text: {seen.get('text')!r}")
            n = nodes[0]
            assert (n["rank"], n["program"], n["wants"], n["flag_rank"], n["kind"]) == \
                (0, 0, 1, 0, "wait"), n
            if comm.backend == "cpu":
                assert "_shared_suite_kernels.py:" in n["where"], n["where"]
    with t.check("planted hang: the wait-for graph's text names it"):
        if me == 0:
            text = seen.get("text", "")
            for part in ("rank 0 program 0", "flag[0]", "for 1"):
                assert part in text, f"{part!r} not in {text!r}"
    if comm.backend == "cuda":
        with t.check("planted hang: the GPU wait records hold its flag's address"):
            if me == 0:
                recs = seen.get("records") or []
                want = (0, flag.data_ptr(), 1)
                got = [(r["program"], r["addr"], r["wants"]) for r in recs]
                assert got == [want], f"records {got}, expected [{want}]"
    else:
        t.skip("planted hang: GPU wait records", "cpu backend: the interpreter's blocked "
               "waits are checked instead (records are empty on CPU)")
    with t.check("planted hang: the peer's cl.notify released it"):
        if me == 0:
            assert "go_error" not in seen, f"writing the peer's go flag: {seen.get('go_error')}"
            assert released, f"not released within {limit:g} s of the go (host wrote it)"
            assert int(flag[2]) == 7, f"the kernel did not run past its wait: {flag.tolist()}"
    with t.check("planted hang: nothing is blocked afterwards"):
        from commlab.racecheck import blocked_waits

        assert blocked_waits() == [], blocked_waits()
    with t.check("planted hang: an all_reduce on every rank is right afterwards"):
        x = torch.full((4099,), float(me + 1), device=comm.device)
        y = commlab.all_reduce(x).cpu()
        assert bool((y == w * (w + 1) / 2).all()), y[:4].tolist()
    commlab.barrier()


# --- overlap --------------------------------------------------------------------------

CPU_SHAPES = ((7, 37, 33), (25, 40, 72))  # rows per rank, K, N: none a tile multiple
CUDA_SHAPES = (*CPU_SHAPES, (512, 1024, 768))  # M = W*512: auto runs the fused kernels


def check_overlap(comm, t: Tally, gen, quick: bool) -> None:
    """ag_gemm and gemm_rs (fused, sequential, auto; bf16 and fp16) against gloo + matmul
    on the CPU copies; three calls per case (epochs, both buffer slots)."""
    w, dev = comm.world_size, comm.device
    shapes = CUDA_SHAPES[1:] if comm.backend == "cuda" else CPU_SHAPES[:1] if quick \
        else CPU_SHAPES
    algos = ("fused", "sequential") if quick else ("fused", "sequential", "auto")
    for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16):
        for rows, k, n in shapes:
            for algo in algos:
                if comm.backend == "cuda" and dtype == torch.float16 and algo != "fused":
                    continue  # each case compiles its own GEMMs (tens of s): fp16 fused only
                label = f"{str(dtype)[6:]} rows={rows} k={k} n={n} {algo}"
                for op in ("ag_gemm", "gemm_rs"):
                    _note(comm, f"{op} {label}")
                    calls = []
                    with t.check(f"{op} {label}"):
                        for _ in range(3):
                            a = torch.randn(rows if op == "ag_gemm" else w * rows, k,
                                            generator=gen).to(dtype)
                            b = torch.randn(k, n, generator=gen).to(dtype)
                            fn = commlab.ag_gemm if op == "ag_gemm" else commlab.gemm_rs
                            try:
                                out = fn(a.to(dev), b.to(dev), algorithm=algo)
                            except Exception as e:
                                out = e
                            if op == "ag_gemm":
                                ref = gloo_all_gather(comm, a) @ b.float()
                            else:  # each rank's partial rounded to dtype, as the transfers do
                                part = (a.float() @ b.float()).to(dtype).float()
                                ref = gloo_all_reduce(comm, part).chunk(w)[comm.rank]
                            calls.append((out, ref))
                        for out, ref in calls:
                            if isinstance(out, Exception):
                                raise out
                            assert out.dtype == dtype, out.dtype
                            assert_bf16_close(out, ref)


def _note(comm, what: str) -> None:
    """Rank 0 says which check starts (a world that hangs shows where in the log)."""
    if comm.rank == 0:
        print(f"  [kernels] {what}", flush=True)


def kernels_world(comm, seed: int, quick: bool) -> dict:
    t = Tally(comm.rank, "kernels")
    gen = torch.Generator().manual_seed(seed * 1000 + 17 + comm.rank)
    _note(comm, "user kernels: ring ping, blockwise-barrier gather")
    check_user_kernels(comm, t, gen)
    if comm.world_size >= 2:
        _note(comm, "planted hang")
        check_hang(comm, t)
    else:
        t.skip("planted hang", "needs two ranks (a peer releases it)")
    check_overlap(comm, t, gen, quick)
    dist.barrier(group=comm.cpu_group)
    return t.result()
