"""Rank function of gpu_shared_suite.py's "collectives" world: every public collective x
every algorithm it accepts x fp32/bf16/fp16/int32 x odd sizes against gloo over the
ranks' CPU copies; on CUDA also graph capture and replay, and all_reduce's per-call
latency (eager and graph), which is recorded, not checked.
"""

from __future__ import annotations

import inspect
import statistics
import time

import torch
import torch.distributed as dist
from _shared_suite_common import (
    DTYPES,
    FLOATS,
    Tally,
    assert_exact,
    assert_sum,
    gloo_all_gather,
    gloo_all_reduce,
    gloo_all_to_all,
    gloo_broadcast,
    random_tensor,
    sync,
)

import commlab
from commlab.bench import capture

# What the README and the ops' docstrings promise (a refusal of one of these is a
# failure); the algorithms each op's Collective lists are added, so a new one is run too.
DOCUMENTED = {
    "all_reduce": ("auto", "one_shot", "two_shot", "ring"),
    "all_gather": ("auto", "direct", "copy_engine"),
    "reduce_scatter": ("auto",),  # no algorithm parameter: one body
    "broadcast": ("auto", "direct", "copy_engine"),
    "all_to_all": ("auto", "direct", "copy_engine"),
}
SIZES = (1, 7, 1000, 4099)  # elements (per chunk for reduce_scatter / all_to_all)
QUICK_SIZES = (1, 1000)
BIG = 1_500_007  # cuda only: 6 MiB of fp32, odd


def algorithms(op: str) -> list[str]:
    """DOCUMENTED's algorithms of ``op`` plus those its Collective accepts (only "auto"
    for an op whose public function takes no ``algorithm``)."""
    if not _takes_algorithm(op):
        return ["auto"]
    import importlib

    coll = getattr(importlib.import_module(f"commlab.collectives.{op}"), op.upper(), None)
    found = coll.algorithms if coll is not None else ()
    return list(dict.fromkeys((*DOCUMENTED[op], *found)))


def _takes_algorithm(name: str) -> bool:
    return "algorithm" in inspect.signature(getattr(commlab, name)).parameters


def _call(name: str, x, algo: str, **kw):
    fn = getattr(commlab, name)
    return fn(x, algorithm=algo, **kw) if _takes_algorithm(name) else fn(x, **kw)


def _one(comm, t: Tally, gen, op: str, algo: str, dtype, n: int, i: int) -> None:
    """One case: fresh data, commlab's result, gloo's, compared (and the input unchanged)."""
    w, dev = comm.world_size, comm.device
    red = ("sum", "max", "min")[i % 3] if op in ("all_reduce", "reduce_scatter") else None
    src = i % w
    if op in ("reduce_scatter", "all_to_all") and n == BIG:  # n is per chunk; BIG in all
        n = BIG // w
    name = (f"{op} {algo} {str(dtype)[6:]} n={n}" + (f" op={red}" if red else "")
            + (f" src={src}" if op == "broadcast" else ""))
    documented = algo in DOCUMENTED[op] and dtype in DTYPES
    rows = n * w if op in ("reduce_scatter", "all_to_all") else n
    x = random_tensor(gen, (rows,), dtype, dev)
    before = x.clone()
    out, err = None, None
    with t.check(name, documented):
        try:
            kw = {"op": red} if red else ({"src": src} if op == "broadcast" else {})
            out = _call(op, x, algo, **kw)
            sync(comm)
        except Exception as e:  # compared below, after every rank made the gloo calls
            err = e
        # references: every rank makes the same gloo calls whatever happened above
        if op == "all_reduce":
            ref = gloo_all_reduce(comm, x, red)
            abs_sum = gloo_all_reduce(comm, x.abs(), "sum") if red == "sum" else None
        elif op == "reduce_scatter":
            ref = gloo_all_reduce(comm, x, red).chunk(w)[comm.rank]
            abs_sum = gloo_all_reduce(comm, x.abs(), "sum").chunk(w)[comm.rank] \
                if red == "sum" else None
        elif op == "all_gather":
            ref = gloo_all_gather(comm, x)
        elif op == "broadcast":
            ref = gloo_broadcast(comm, x, src)
        else:
            ref = gloo_all_to_all(comm, x)
        if err is not None:
            raise err
        assert out is not None and out.dtype == dtype, f"dtype {getattr(out, 'dtype', None)}"
        if red == "sum" and dtype in FLOATS:
            assert abs_sum is not None
            assert_sum(out, ref, abs_sum, w, roundings=w if algo == "ring" else 1)
        else:
            assert_exact(out, ref)
        if not torch.equal(x, before):
            raise AssertionError(f"{op} modified its input")


def check_collectives(comm, t: Tally, gen, quick: bool) -> None:
    sizes = QUICK_SIZES if quick else SIZES + ((BIG,) if comm.backend == "cuda" else ())
    i = comm.world_size
    for op in DOCUMENTED:
        for algo in algorithms(op):
            for d, dtype in enumerate(DTYPES):
                for s, n in enumerate(sizes):
                    i += 1
                    if quick and (d + s + len(algo)) % 2:  # quick: half the pairs, each
                        continue  # dtype and size still met by every algorithm
                    _one(comm, t, gen, op, algo, dtype, n, i)
    with t.check("barrier: no rank leaves before every rank has entered"):
        for r in range(comm.world_size):  # each rank in turn arrives last
            if comm.rank == r:
                time.sleep(0.2)
            entered = time.time()
            commlab.barrier()
            left = time.time()
            times = [torch.empty(2, dtype=torch.float64) for _ in range(comm.world_size)]
            dist.all_gather(times, torch.tensor([entered, left], dtype=torch.float64),
                            group=comm.cpu_group)
            last_in = max(float(t_[0]) for t_ in times)
            first_out = min(float(t_[1]) for t_ in times)
            assert first_out >= last_in, (f"with rank {r} last, a rank left "
                                          f"{last_in - first_out:.3f} s before it entered")


# --- CUDA graphs --------------------------------------------------------------------

GRAPH_CASES = (("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("all_reduce", "auto"),
               ("all_gather", "direct"), ("all_gather", "copy_engine"),
               ("reduce_scatter", "auto"), ("broadcast", "auto"), ("all_to_all", "copy_engine"))
REPLAYS = 3


def _align(comm) -> None:
    comm.synchronize()
    dist.barrier(group=comm.cpu_group)


def check_graphs(comm, t: Tally, gen) -> None:
    """Capture once, replay REPLAYS times with new data copied into the captured input."""
    w = comm.world_size
    for op, algo in GRAPH_CASES:
        n = 4099
        rows = n * w if op in ("reduce_scatter", "all_to_all") else n
        x = torch.zeros(rows, device=comm.device)
        call = (lambda op=op, algo=algo, x=x: _call(op, x, algo, src=w - 1)) \
            if op == "broadcast" else (lambda op=op, algo=algo, x=x: _call(op, x, algo))
        graph = out = None
        with t.check(f"graph capture {op} {algo}"):
            call()  # eager first: compiled, plans made
            graph, out = capture(comm, call, 1)
        for rep in range(REPLAYS):
            new = random_tensor(gen, (rows,), torch.float32, comm.device)
            x.copy_(new)
            ok = graph is not None
            if ok:
                graph.replay()
                sync(comm)
            if op == "all_reduce":
                ref = gloo_all_reduce(comm, new)
                abs_sum = gloo_all_reduce(comm, new.abs())
            elif op == "reduce_scatter":
                ref = gloo_all_reduce(comm, new).chunk(w)[comm.rank]
                abs_sum = gloo_all_reduce(comm, new.abs()).chunk(w)[comm.rank]
            elif op == "all_gather":
                ref = gloo_all_gather(comm, new)
            elif op == "broadcast":
                ref = gloo_broadcast(comm, new, w - 1)
            else:
                ref = gloo_all_to_all(comm, new)
            dist.barrier(group=comm.cpu_group)  # nobody replays again before all compared
            if not ok:
                continue
            with t.check(f"graph replay {rep + 1} {op} {algo}"):
                if op in ("all_reduce", "reduce_scatter"):
                    assert_sum(out, ref, abs_sum, w)
                else:
                    assert_exact(out, ref)
        del graph
        _align(comm)


# --- latency (recorded, not checked) ---------------------------------------------------

LATENCY_BYTES = (8, 64 << 10, 1 << 20)
GRAPH_CALLS = 20


def _slowest(comm, us: float) -> float:
    v = torch.tensor([us], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX, group=comm.cpu_group)
    return float(v)


def latency(comm, t: Tally, quick: bool) -> dict:
    """all_reduce (bf16, auto) per call, µs, the slowest rank's median: "eager" (a CUDA
    event pair around each of 50 calls after 10 warm-up calls, host cost included) and
    "graph" (replays of 20 captured calls, per call). Ranks sharing a GPU time-slice."""
    from commlab.bench import time_per_call

    out: dict = {"op": "all_reduce", "dtype": "bfloat16", "algorithm": "auto",
                 "world_size": comm.world_size}
    for nbytes in LATENCY_BYTES[:1] if quick else LATENCY_BYTES:
        x = torch.randn(max(1, nbytes // 2), device=comm.device).to(torch.bfloat16)
        call = lambda x=x: commlab.all_reduce(x)
        with t.check(f"latency runs: all_reduce {nbytes} B"):
            eager = time_per_call(call, 50, warmup=10, queued=False, group=comm.cpu_group)
            g, _ = capture(comm, call, GRAPH_CALLS)
            g.replay()
            samples = []
            for _ in range(5):
                _align(comm)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                samples.append(s.elapsed_time(e) * 1e3 / GRAPH_CALLS)
            graph = _slowest(comm, statistics.median(samples))
            out[str(nbytes)] = {"eager": round(eager, 2), "graph": round(graph, 2)}
            del g
            _align(comm)
    return out


def collectives_world(comm, seed: int, quick: bool) -> dict:
    """The whole "collectives" world on one rank; returns the tally's result."""
    t = Tally(comm.rank, "collectives")
    gen = torch.Generator().manual_seed(seed * 1000 + comm.rank)  # different data per rank
    t.extra["device"] = _device_name(comm)
    t.extra["heap"] = getattr(comm, "heap_kind", None)
    t.extra["rank_devices"] = _gathered_str(comm, str(comm.device))
    check_collectives(comm, t, gen, quick)
    if comm.backend == "cuda":
        check_graphs(comm, t, gen)
        t.extra["latency_us"] = latency(comm, t, quick)
    else:
        t.skip("graph capture and replay", "cuda only")
        t.skip("latency", "cuda only (CUDA events)")
    return t.result()


def _device_name(comm) -> str:
    from commlab.bench import device_name

    return device_name(comm)


def _gathered_str(comm, s: str) -> list[str]:
    out: list = [None] * comm.world_size
    dist.all_gather_object(out, s, group=comm.cpu_group)
    return out
