"""Per-link bandwidth: every ordered pair of ranks, over a size sweep.

For each (reader i, source j) in turn — only rank i moves data, the others wait at a
host barrier, so a pair is measured alone — rank i copies rank j's symmetric buffer
into a local one, with

* ``triton``: a Triton copy kernel reading through ``cl.symm_at(src, j, ctx)``
  (on CPU the Triton interpreter, on GPU compiled loads over NVLink/PCIe);
* ``memcpy``: ``dst.copy_(peer_view)`` on a tensor built over rank j's mapping of the
  heap — a copy-engine (cudaMemcpy) peer copy on GPU, a ``memcpy`` on CPU.

    GB/s = bytes / median time;  % of peak = GB/s / edge.peak_gbps
    (i == j is a local copy: the diagonal is each rank's own memory bandwidth)

In a world across hosts a kernel reaches only its host's heap: pairs on one host are read
as above (through ``comm.local``), pairs on different hosts with torch.distributed
point-to-point (gloo on CPU, NCCL on GPU): the reader sends a 4-byte request, the source
sends the buffer, the reader times both (so small sizes show the round trip). That
``p2p`` figure fills the cross-host cells of every method; ``LinkBenchResult.cross_host``
marks them.

Run on a world with ``run(comm, ...)`` (every rank calls it, every rank gets the
``LinkBenchResult``), or ``measure``/``rank_run`` for one rank's row, which
``LinkBenchResult.from_rows`` assembles.
"""

from __future__ import annotations

import functools
import math
import statistics
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import commlab.language as cl
from commlab.runtime import get_communicator, symmetric_empty
from commlab.runtime.peer import peer_view
from commlab.topology._bench_result import LinkBenchResult

CPU_SIZES = tuple(4 << (2 * k + 10) for k in range(5))  # 4 KiB .. 1 MiB, x4 apart
GPU_SIZES = tuple(64 << (2 * k + 10) for k in range(7))  # 64 KiB .. 256 MiB
METHODS = ("triton", "memcpy")


@triton.jit
def peer_copy_kernel(
    # Symmetric buffers
    src_ptr,  # [n] int32, read on rank `peer`
    # Local buffers
    dst_ptr,  # [n] int32
    ctx,
    peer,
    # Sizes
    n,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # --- the peer's copy of src: same heap offset, the peer's base (heap blocks are
    # 256-byte aligned, so 16-byte vector loads stay legal)
    remote = tl.multiple_of(cl.symm_at(src_ptr, peer, ctx), 16)
    # --- grid-stride copy: every program streams BLOCK elements per step
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst_ptr + offs, tl.load(remote + offs, mask=mask), mask=mask)


def _launch(comm, n: int) -> tuple[int, int, int]:
    """(programs, BLOCK, num_warps) for an n-element copy."""
    if comm.backend == "cpu":  # interpreter: one program, big blocks (one numpy op each)
        return 1, min(1 << 16, triton.next_power_of_2(max(n, 16))), 4
    sms = torch.cuda.get_device_properties(comm.device).multi_processor_count
    block = 4096
    return max(1, min(math.ceil(n / block), sms * 4)), block, 8


def _copy(comm, method, src, dst, peer_src, peer, n):
    if method == "triton":
        progs, block, warps = _launch(comm, n)
        peer_copy_kernel[(progs,)](src, dst, comm.context, peer, n, BLOCK=block,
                                   num_warps=warps)
    else:
        dst[:n].copy_(peer_src[:n])


def _time(comm, fn, iters: int) -> float:
    """Median seconds of ``fn`` over ``iters`` runs after a warm-up."""
    fn()
    if comm.backend == "cuda":
        torch.cuda.synchronize(comm.device)
        out = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return statistics.median(out)
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _pattern(rank: int, n: int, device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32, device=device) + (rank << 24)


def measure(comm, sizes=None, iters: int | None = None, methods=METHODS,
            progress=None) -> dict:
    """Every rank calls this; returns this rank's row: {"rank", "gbps": {method: [[...]]}}
    with gbps[method][size_index][source_rank] for this rank as the reader.

    ``progress``: an object with ``put`` (a queue) that rank 0 feeds ``(done, total)``.
    """
    sizes = tuple(sizes or (CPU_SIZES if comm.backend == "cpu" else GPU_SIZES))
    iters = iters or (3 if comm.backend == "cpu" else 20)
    threads = torch.get_num_threads()
    if comm.backend == "cpu":
        # Ranks share the cores: another rank's idle OpenMP threads spinning would be
        # measured as a slow link. One thread per rank measures the memory, not the spin.
        torch.set_num_threads(1)
    try:
        return _measure(comm, sizes, iters, methods, progress)
    finally:
        torch.set_num_threads(threads)


def _measure(comm, sizes, iters, methods, progress) -> dict:
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"linkbench: unknown method {bad[0]!r}; use one of {METHODS}")
    world, me, local = comm.world_size, comm.rank, comm.local
    host_of = {r: h for h, ranks in enumerate(comm.hosts) for r in ranks}
    index_of = {r: ranks.index(r) for ranks in comm.hosts for r in ranks}  # local index
    n_max = max(sizes) // 4
    src = symmetric_empty((n_max,), torch.int32)
    src.copy_(_pattern(me, n_max, src.device))
    dst = torch.empty(n_max, dtype=torch.int32, device=src.device)
    comm.synchronize()
    dist.barrier(group=comm.cpu_group)  # every rank's pattern is written
    views = {j: peer_view(local, src, index_of[j]) for j in comm.hosts[host_of[me]]}
    gbps = {m: [[0.0] * world for _ in sizes] for m in methods}
    p2p: dict[tuple[int, int], float] = {}  # (size index, source): measured once for all
    total, done = len(methods) * len(sizes) * world * world, 0
    for m in methods:
        for si, nbytes in enumerate(sizes):
            n = nbytes // 4
            for i in range(world):
                for j in range(world):
                    dist.barrier(group=comm.cpu_group)  # only the reader (and source) run now
                    if host_of[i] != host_of[j]:
                        if me in (i, j) and m == methods[0]:  # once, for every method
                            t = _p2p_pair(comm, me, i, j, src, dst, n, iters)
                            if me == i:
                                p2p[(si, j)] = nbytes / t / 1e9
                        if me == i:
                            gbps[m][si][j] = p2p[(si, j)]
                    elif me == i:
                        copy = functools.partial(_copy, local, m, src, dst, views[j],
                                                 index_of[j], n)
                        dst[:n].fill_(-1)
                        copy()
                        _verify(dst[:n], j, m)
                        gbps[m][si][j] = nbytes / _time(comm, copy, iters) / 1e9
                    done += 1
                    if progress is not None and me == 0:
                        progress.put((done, total))
    dist.barrier(group=comm.cpu_group)  # nobody reads src any more: it may be freed
    return {"rank": me, "gbps": gbps}


def _p2p_pair(comm, me: int, i: int, j: int, src, dst, n: int, iters: int) -> float:
    """Reader ``i`` gets ``n`` int32 from ``j`` on another host: checked once, then timed
    (median seconds, on the reader; the source returns 0)."""
    ask = torch.zeros(1, dtype=torch.int32, device=src.device)

    g = comm.group  # commlab's gloo (CPU) / NCCL (GPU) world group, never its own backend

    def once():
        if me == i:
            dist.send(ask, j, group=g)
            dist.recv(dst[:n], j, group=g)
        else:
            dist.recv(ask, i, group=g)
            dist.send(src[:n], i, group=g)
        if comm.backend == "cuda":
            torch.cuda.synchronize(comm.device)

    if me == i:
        dst[:n].fill_(-1)
    once()
    if me == i:
        _verify(dst[:n], j, "p2p")
    return _time(comm, once, iters)


def _verify(got: torch.Tensor, src_rank: int, method: str) -> None:
    want = _pattern(src_rank, got.numel(), got.device)
    if not torch.equal(got, want):
        k = int((got != want).nonzero()[0])
        raise RuntimeError(f"linkbench: {method} copy from rank {src_rank} is wrong at element "
                           f"{k} (got {int(got[k])}, want {int(want[k])}); the heap mapping of "
                           f"rank {src_rank} is broken")


def rank_run(comm, sizes=None, iters=None, methods=METHODS, progress=None) -> dict:
    """``measure`` plus what the client needs to build a result (for run_world/apply)."""
    row = measure(comm, sizes, iters, methods, progress)
    row.update(backend=comm.backend, world_size=comm.world_size,
               device=_device_name(comm),
               sizes=list(sizes or (CPU_SIZES if comm.backend == "cpu" else GPU_SIZES)),
               methods=list(methods), hosts=comm.hosts)
    return row


def run(comm=None, sizes=None, iters: int | None = None, methods=METHODS,
        topology=None) -> LinkBenchResult:
    """Measure every ordered pair of ``comm``'s world (default: this process's); every
    rank calls it and every rank gets the whole ``LinkBenchResult``. Collective."""
    comm = comm or get_communicator()
    row = rank_run(comm, sizes, iters, methods)
    rows: list = [None] * comm.world_size
    dist.all_gather_object(rows, row, group=comm.cpu_group)
    return LinkBenchResult.from_rows(rows, topology)


def _device_name(comm) -> str:
    if comm.backend == "cuda":
        return torch.cuda.get_device_name(comm.device)
    import platform

    return f"CPU {platform.processor() or platform.machine()}"


def result_from_rows(rows: list[dict], topology=None) -> LinkBenchResult:
    return LinkBenchResult.from_rows(rows, topology)
