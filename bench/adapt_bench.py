"""Online selection against fixed algorithms and the static table while conditions change.

    python bench/adapt_bench.py                                  # CPU, 4 ranks
    python bench/adapt_bench.py --backend cuda --ranks 2         # 2 ranks sharing one GPU

Phases (all_reduce, fp32), run in order on one world:
  base   a small message, nothing else running
  load   the same message, a competing load beside rank ranks-1 (CPU: a busy process
         on that rank's core; cuda: a copy flood on its GPU from a side stream)
  size   a larger message, load gone
In each phase every fixed algorithm runs --fixed calls (after warm-up), then the
adaptive ``auto`` (COMMLAB_ADAPT=1, its state kept across phases) runs --calls calls.
Per call: rank 0's host time around the call (CPU: the interpreter finishes the kernel
inside the call; cuda: a device synchronize after every call). The record per phase:
the median of each fixed algorithm, the static table's choice and its median, the
adaptive median over its last 50 calls, and the first call after which the adaptive
choice stayed the phase's best. Writes bench/results/adapt-<backend>-w<N>.json and .svg.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ALGS = ("one_shot", "two_shot", "ring")
HERE = Path(__file__).resolve().parent


def _load_start(comm, backend: str):
    """The competing load beside this rank (CPU: a busy process on its core)."""
    if backend == "cpu":
        core = sorted(os.sched_getaffinity(0))[-1]
        os.sched_setaffinity(0, {core})
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(p.pid, {core})
        return p
    import threading

    stop = threading.Event()
    a = torch.empty(256 << 20, dtype=torch.uint8, device=comm.device)
    b = torch.empty_like(a)
    side = torch.cuda.Stream(device=comm.device)

    def flood():
        with torch.cuda.stream(side):
            while not stop.is_set():
                for _ in range(8):
                    b.copy_(a)
                side.synchronize()

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    return (stop, t)


def _load_stop(handle, backend: str) -> None:
    if backend == "cpu":
        handle.kill()
        handle.wait()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    else:
        stop, t = handle
        stop.set()
        t.join()


def _time_calls(comm, x, algorithm: str, n: int, cuda: bool) -> tuple[list[float], list[str]]:
    import commlab
    from commlab.collectives import _adapt

    times, chosen = [], []
    key = _adapt.key_for(comm, "all_reduce", x)
    for _ in range(n):
        t = time.perf_counter()
        commlab.all_reduce(x, algorithm=algorithm)
        if cuda:
            torch.cuda.synchronize(comm.device)
        times.append((time.perf_counter() - t) * 1e6)
        st = _adapt._state(comm).get(key)
        chosen.append(st.current if st is not None and algorithm == "auto" else algorithm)
    commlab.synchronize()
    return times, chosen


def _rank(comm, phases, fixed: int, calls: int, backend: str):
    from commlab.collectives import _select

    cuda = backend == "cuda"
    out = []
    for name, nbytes, loaded in phases:
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=comm.device)
        handle = _load_start(comm, backend) if loaded and comm.rank == comm.world_size - 1 else None
        try:
            fixed_t = {}
            for alg in ALGS:
                _time_calls(comm, x, alg, 3, cuda)  # warm-up: compile, plans
                fixed_t[alg] = statistics.median(_time_calls(comm, x, alg, fixed, cuda)[0])
            table = _select.choose(comm, "all_reduce", x.dtype, nbytes, ALGS)
            times, chosen = _time_calls(comm, x, "auto", calls, cuda)
        finally:
            if handle is not None:
                _load_stop(handle, backend)
        best = min(fixed_t, key=fixed_t.__getitem__)
        settled = next((i for i in range(len(chosen)) if all(c == best for c in chosen[i:])),
                       None)
        out.append({"phase": name, "bytes": nbytes, "loaded_rank": comm.world_size - 1
                    if loaded else None, "fixed_us": fixed_t, "best": best, "table": table,
                    "table_us": fixed_t[table], "adaptive_us": statistics.median(times[-50:]),
                    "adaptive_times_us": times, "adaptive_choice": chosen,
                    "settled_after_calls": settled})
    return out


def _svg(results: list[dict], title: str) -> str:
    """Per phase: the adaptive call times (dots), each fixed algorithm's median (lines)."""
    w, h, pad = 900, 360, 50
    times = [t for p in results for t in p["adaptive_times_us"]]
    ymax = max(max(times), *(v for p in results for v in p["fixed_us"].values())) * 1.05
    n = len(times)
    colors = {"one_shot": "#1f77b4", "two_shot": "#d62728", "ring": "#2ca02c"}

    def xy(i, t):
        return pad + (w - 2 * pad) * i / max(n - 1, 1), h - pad - (h - 2 * pad) * t / ymax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<text x="{pad}" y="20" font-size="14">{title}</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<text x="5" y="{pad}" font-size="10">{ymax:.0f} µs</text>']
    i0 = 0
    for p in results:
        m = len(p["adaptive_times_us"])
        xa, _ = xy(i0, 0)
        xb, _ = xy(i0 + m - 1, 0)
        parts.append(f'<text x="{xa}" y="{h - pad + 15}" font-size="11">{p["phase"]} '
                     f'({p["bytes"] >> 10} KiB)</text>')
        for alg, t in p["fixed_us"].items():
            _, y = xy(0, t)
            parts.append(f'<line x1="{xa}" y1="{y}" x2="{xb}" y2="{y}" stroke="{colors[alg]}" '
                         f'stroke-dasharray="4,3"/>')
        for j, (t, c) in enumerate(zip(p["adaptive_times_us"], p["adaptive_choice"],
                                       strict=True)):
            x, y = xy(i0 + j, t)
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.6" fill="{colors[c]}"/>')
        i0 += m
    for k, (alg, c) in enumerate(colors.items()):
        parts.append(f'<text x="{w - 160}" y="{40 + 14 * k}" font-size="11" fill="{c}">'
                     f'{alg} (dashed: fixed median)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--fixed", type=int, default=20, help="calls per fixed algorithm")
    ap.add_argument("--calls", type=int, default=200, help="adaptive calls per phase")
    ap.add_argument("--small", default=64 << 10, type=int, help="bytes, phases base/load")
    ap.add_argument("--large", default=4 << 20, type=int, help="bytes, phase size")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from commlab.testing import run_world

    phases = [("base", a.small, False), ("load", a.small, True), ("size", a.large, False)]
    res = run_world(_rank, a.ranks, args=(phases, a.fixed, a.calls, a.backend),
                    backend=a.backend, timeout=3600, env={"COMMLAB_ADAPT": "1"})[0]
    out = Path(a.out or HERE / "results" / f"adapt-{a.backend}-w{a.ranks}.json")
    summary = []
    for p in res:
        gap = p["adaptive_us"] / p["fixed_us"][p["best"]] - 1
        gain = p["table_us"] / p["adaptive_us"] - 1
        p["adaptive_vs_best"], p["adaptive_vs_table"] = gap, gain
        summary.append(f"{p['phase']:5s} {p['bytes'] >> 10:6d} KiB  best {p['best']} "
                       f"{p['fixed_us'][p['best']]:.0f} us, table {p['table']} "
                       f"{p['table_us']:.0f} us, adaptive {p['adaptive_us']:.0f} us "
                       f"({gap:+.1%} vs best, {gain:+.1%} faster than the table), settled "
                       f"after {p['settled_after_calls']} calls")
    print("\n".join(summary))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"backend": a.backend, "ranks": a.ranks, "phases": res,
                               "summary": summary}, indent=1))
    out.with_suffix(".svg").write_text(
        _svg(res, f"all_reduce fp32, {a.ranks} ranks ({a.backend}): adaptive auto per call"))
    print(f"wrote {out} and {out.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
