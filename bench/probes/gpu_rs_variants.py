"""Where does the fused GEMM + reduce-scatter spend the time its GEMM alone does not?

    torchrun --nproc-per-node 2 bench/probes/gpu_rs_variants.py --out DIR

At 86348d5 the fused gemm_rs hid 79.6% of the reduce-scatter for Llama-3 8B at M=8192:
638.4 us against 608.8 us for its Triton GEMM alone (bench/results/overlap-2xh200-w2.json).
This script times, side by side in interleaved rounds (the overlap benchmark's timer:
median of queued back-to-back calls, the slowest rank's):

    sequential        torch.matmul, then NCCL reduce-scatter (the baseline of "hidden")
    comm_only         the NCCL reduce-scatter alone
    triton_gemm_only  the fused kernels' GEMM alone, one launch over all M rows
    no_send           the fused launches with no pushes and no waits (epoch 0): what
                      the launches cost without the communication (a wrong result)
    fused:<form>      commlab.gemm_rs, the own tiles reading the peers' partials with
                      plain loads ("load") or TMA ("tma", the default); "tma/16MiB":
                      the partial chunks sent in pieces of >= 16 MiB instead of 4

(On c7a51e4 a form "early", the partials starting the accumulator before the main loop
when already landed, ran 10-12% slower: bench/results/history/rs-epilogue-forms-2xh200.json.)
While each impl runs, a thread samples this GPU's SM clock and power through NVML: a
GPU at its power limit lowers its clock, and long GEMMs (70B) vary by several percent
from round to round.

Every fused form is checked against torch.matmul + NCCL first. Then one traced call per
form at the first shape: the own tiles' mean wait and reduce time, and the idle gap
between the last peer-chunk tile and the first own tile. Writes DIR/rs-variants.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import commlab  # noqa: E402
from commlab.bench import QUEUE_SLEEP_CYCLES, device_name, git_commit, time_per_call  # noqa: E402
from commlab.overlap import matmul  # noqa: E402

rs = importlib.import_module("commlab.overlap.gemm_rs")  # (the package exports the function)

# (model, M, K, N) of the local GEMM, W=2 (commlab.bench.overlap.SHAPES)
SHAPES = [("8B", 8192, 7168, 4096), ("70B", 8192, 14336, 8192), ("8B", 16384, 7168, 4096),
          ("70B", 2048, 14336, 8192)]
FORMS = {"load": (False, 4 << 20), "tma": (True, 4 << 20), "tma/16MiB": (True, 16 << 20)}


def log(comm, *a):
    if comm.rank == 0:
        print(*a, flush=True)


def form(name: str):
    rs.PARTIALS_TMA, rs.PIECE_BYTES = FORMS[name]


class Clocks:
    """NVML samples of this GPU's SM clock (MHz) and power (W) every 5 ms while on."""

    def __init__(self, index: int):
        import threading

        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # no NVML: timings without clocks
            print(f"no NVML clock samples: {e}", flush=True)
            self.nvml = None
        self.samples: list = []
        self.on = threading.Event()
        self.stop = threading.Event()
        if self.nvml:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stop.is_set():
            if self.on.is_set():
                clk = self.nvml.nvmlDeviceGetClockInfo(self.h, self.nvml.NVML_CLOCK_SM)
                watts = self.nvml.nvmlDeviceGetPowerUsage(self.h) / 1e3
                self.samples.append((clk, watts))
            time.sleep(0.005)

    def measure(self, fn):
        """(fn(), mean SM MHz, mean W) over fn's run (nan without samples)."""
        self.samples = []
        self.on.set()
        try:
            out = fn()
        finally:
            self.on.clear()
        got = list(self.samples)
        if not got:
            return out, float("nan"), float("nan")
        return (out, statistics.mean(c for c, _ in got), statistics.mean(w for _, w in got))


def impls(comm, a, b, part, out) -> dict:

    def fused(name):
        def run():
            form(name)
            return commlab.gemm_rs(a, b, algorithm="fused")
        return run

    def no_send():
        form("tma")
        return rs._fused(comm, a, b, send=False)[0]

    return {
        "sequential": lambda: (torch.matmul(a, b, out=part),
                               dist.reduce_scatter_tensor(out, part, group=comm.group)),
        "comm_only": lambda: dist.reduce_scatter_tensor(out, part, group=comm.group),
        "triton_gemm_only": lambda: matmul(comm, a, b),
        "no_send": no_send,
        **{f"fused:{f}": fused(f) for f in FORMS},
    }


def check(comm, fns, a, b) -> int:
    part = (a @ b)
    ref = torch.empty(a.shape[0] // comm.world_size, b.shape[1], device=a.device,
                      dtype=a.dtype)
    dist.reduce_scatter_tensor(ref, part, group=comm.group)
    fails = 0
    for name, fn in fns.items():
        if not name.startswith("fused"):
            continue
        for _ in range(3):  # both inbox slots
            err = (fn().float() - ref.float()).abs().max().item()
            tol = 1e-2 * max(1.0, ref.float().abs().max().item())
            if not err <= tol:
                fails += 1
                print(f"[rank {comm.rank}] FAIL {name}: max err {err:.3g} > {tol:.3g}",
                      flush=True)
    t = torch.tensor([fails], device=a.device)
    dist.all_reduce(t, group=comm.group)
    return int(t.item())


def trace_summary(comm, fn) -> dict:
    """One traced call: the own tiles' mean wait and reduce (us), and the gap between
    the last peer-chunk tile's end and the first own tile's start (this rank)."""
    for _ in range(2):
        commlab.trace.start()
        fn()
        commlab.trace.stop()
    torch.cuda.synchronize()
    dist.barrier(group=comm.cpu_group)
    commlab.trace.start()
    torch.cuda._sleep(QUEUE_SLEEP_CYCLES)  # device time, not the host's launch gaps
    fn()
    spans = [s for s in commlab.trace.stop() if getattr(s, "meta", None)
             and "tile" in s.meta]
    by = {}
    for s in spans:
        by.setdefault(s.kind, []).append(s)
    wait = [s.end_us - s.start_us for s in by.get("wait", [])]
    red = [s.end_us - s.start_us for s in by.get("reduce", [])]
    own = {s.meta["tile"] for s in by.get("wait", [])}  # only own tiles wait
    comp = by.get("compute", [])
    own0 = min((s.start_us for s in comp if s.meta["tile"] in own), default=float("nan"))
    peer_end = max((s.end_us for s in comp if s.meta["tile"] not in own),
                   default=float("nan"))
    return dict(wait_us=statistics.mean(wait) if wait else 0.0,
                reduce_us=statistics.mean(red) if red else 0.0,
                launch_gap_us=own0 - peer_end,
                span_us=max(s.end_us for s in comp) - min(s.start_us for s in comp))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes")
    args = p.parse_args()
    comm = commlab.init(backend="cuda", heap_size="6GiB", scratch_size="256MiB")
    torch.cuda.set_device(comm.device)
    dev = comm.device
    commit = os.environ.get("COMMLAB_COMMIT") or git_commit()
    records, fails = [], 0
    clocks = Clocks(comm.device.index)
    for model, m, k, n in SHAPES[:args.shapes]:
        g = torch.Generator(device=dev).manual_seed(17 + comm.rank)
        a = torch.randn(m, k, device=dev, generator=g).bfloat16()
        b = (torch.randn(k, n, device=dev, generator=g) / k**0.5).bfloat16()
        part = torch.empty(m, n, device=dev, dtype=a.dtype)
        out = torch.empty(m // comm.world_size, n, device=dev, dtype=a.dtype)
        fns = impls(comm, a, b, part, out)
        bad = check(comm, fns, a, b)
        fails += bad
        log(comm, f"{model} M={m}: check {'ok' if not bad else f'{bad} FAILURES'}")
        times = {name: [] for name in fns}
        mhz = {name: [] for name in fns}
        watts = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                t, clk, w = clocks.measure(lambda fn=fn: time_per_call(
                    fn, args.iters, warmup=5, group=comm.cpu_group))
                times[name].append(t)
                mhz[name].append(clk)
                watts[name].append(w)
        med = {name: statistics.median(v) for name, v in times.items()}
        seq, comm_t = med["sequential"], med["comm_only"]
        for name, t in med.items():
            hidden = (seq - t) / comm_t if name.startswith("fused") else None
            records.append(dict(op="gemm_rs", impl=name, model=f"llama3-{model}", m=m, n=n,
                                k=k, dtype="bfloat16", world_size=comm.world_size,
                                time_us=round(t, 2), rounds=[round(v, 2) for v in times[name]],
                                sm_mhz=[round(v) for v in mhz[name]],
                                watts=[round(v) for v in watts[name]],
                                hidden=None if hidden is None else round(hidden, 4),
                                device=device_name(comm), commit=commit, mode="queued"))
            log(comm, f"  {name:18s} {t:9.1f} us  rounds "
                      + " ".join(f"{v:.1f}" for v in times[name])
                      + "  MHz " + " ".join(f"{v:.0f}" for v in mhz[name])
                      + "  W " + " ".join(f"{v:.0f}" for v in watts[name])
                      + ("" if hidden is None else f"   hidden {hidden:6.1%}"))
    model, m, k, n = SHAPES[0]
    g = torch.Generator(device=dev).manual_seed(5)
    a = torch.randn(m, k, device=dev, generator=g).bfloat16()
    b = (torch.randn(k, n, device=dev, generator=g) / k**0.5).bfloat16()
    fns = impls(comm, a, b, None, None)
    for f in FORMS:
        s = trace_summary(comm, fns[f"fused:{f}"])
        records.append(dict(op="gemm_rs", impl=f"fused:{f}", kind="trace", rank=comm.rank,
                            model=f"llama3-{model}", m=m, n=n, k=k, commit=commit,
                            **{key: round(v, 2) for key, v in s.items()}))
        print(f"[rank {comm.rank}] trace {f:10s} own tile wait {s['wait_us']:.2f} us, "
              f"reduce {s['reduce_us']:.2f} us, gap between launches "
              f"{s['launch_gap_us']:.1f} us, tiles span {s['span_us']:.1f} us", flush=True)
    form("tma")
    clocks.stop.set()
    gathered = [None] * comm.world_size
    dist.all_gather_object(gathered, records, group=comm.cpu_group)
    if comm.rank == 0:
        path = Path(args.out) / "rs-variants.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        mine = gathered[0] + [r for rr in gathered[1:] for r in rr if r.get("kind") == "trace"]
        path.write_text(json.dumps(mine, indent=1) + "\n")
        print(f"wrote {path}", flush=True)
    commlab.finalize()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
