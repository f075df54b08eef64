"""Timers: warm-up, then many repetitions, median per rank, slowest rank wins.

* CPU backend: host clock (``time.perf_counter``) around each call.
* CUDA eager: ``inner`` back-to-back launches between two CUDA events.
* CUDA graph: ``calls`` launches captured in one CUDA graph; each replay is timed with
  CUDA events and divided by ``calls``.

Before every repetition the ranks meet (a gloo barrier, then the device drains), so a
rank that started late is not billed to its peers. The per-rank medians are combined
with MAX: a collective is done when its slowest rank is.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

GRAPH_CALLS = 20  # calls captured per graph (fewer for big messages, see graph_calls)
GRAPH_MEMORY = 4 << 30  # bytes of outputs a graph may hold at once


def _align(comm) -> None:
    comm.synchronize()
    dist.barrier(group=comm.cpu_group)


def _max_over(group, us: float) -> float:
    """The largest of every rank's ``us`` over ``group`` (gloo)."""
    t = torch.tensor([us], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _slowest(comm, median_us: float) -> float:
    return _max_over(comm.cpu_group, median_us)


def time_host(comm, call, *, reps: int, warmup: int = 1) -> float:
    """Median µs of one call, host clock (CPU backend)."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(reps):
        _align(comm)
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _slowest(comm, statistics.median(samples))


def time_eager(comm, call, *, reps: int, inner: int, warmup: int = 3) -> float:
    """Median µs of one call, ``inner`` back-to-back launches between CUDA events."""
    for _ in range(warmup):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        _align(comm)
        start.record()
        for _ in range(inner):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return _slowest(comm, statistics.median(samples))


def time_back_to_back(fn, iters: int, *, warmup: int = 2, group=None) -> float:
    """µs per call of ``iters`` back-to-back calls between two CUDA events, after a
    warm-up, a device drain and a barrier (on ``group``; the slowest rank's time when
    ``group`` is given). The device scripts in bench/ time with this."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=group)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / iters
    return us if group is None else _max_over(group, us)


QUEUE_SLEEP_CYCLES = 80_000_000  # ~40 ms of device sleep on H200


def time_per_call(fn, iters: int, *, warmup: int = 5, queued: bool = True,
                  sleep_cycles: int = QUEUE_SLEEP_CYCLES, group=None) -> float:
    """Median µs of one call from a CUDA-event pair around each of ``iters``
    back-to-back calls, after a warm-up and a device drain (and a barrier plus the
    slowest rank's median when ``group``, a gloo group, is given).

    queued: the device first sleeps while the host enqueues every call, so each event
    pair brackets device work only (what the GPU spends when the host runs ahead, as
    in a training step); otherwise the host's per-call cost shows when it is larger."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if group is not None:
        dist.barrier(group=group)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    if queued:
        torch.cuda._sleep(sleep_cycles)  # longer than enqueuing every call
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    med = statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev)
    return med if group is None else _max_over(group, med)


def graph_calls(out_bytes: int) -> int:
    """Calls per graph: GRAPH_CALLS, fewer when their outputs would not fit GRAPH_MEMORY."""
    return max(1, min(GRAPH_CALLS, GRAPH_MEMORY // max(1, out_bytes)))


def capture(comm, call, calls: int):
    """Capture ``calls`` calls in one CUDA graph; return (graph, output of the last call).

    The caller has already run ``call`` eagerly (Triton compiled, NCCL connected). Every
    rank captures the same calls in the same order, so commlab's host agreement, which
    runs here at capture time only, matches across ranks."""
    _align(comm)
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(comm.device)
    stream.wait_stream(torch.cuda.current_stream(comm.device))
    with torch.cuda.stream(stream):
        call()  # a warm-up on the capture stream, as torch.cuda.graph recommends
    torch.cuda.current_stream(comm.device).wait_stream(stream)
    _align(comm)
    out = None
    # thread_local: NCCL's watchdog thread may query events while we capture
    with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
        for _ in range(calls):
            out = call()
    _align(comm)
    return g, out


def time_graph(comm, graph, calls: int, *, reps: int, warmup: int = 2) -> float:
    """Median µs of one call from replays of a graph holding ``calls`` calls."""
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        _align(comm)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return _slowest(comm, statistics.median(samples))
