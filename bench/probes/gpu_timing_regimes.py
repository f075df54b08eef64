"""Two ways to time the overlap benchmark's impls, side by side, with the SM clock.

    torchrun --nproc-per-node 2 bench/probes/gpu_timing_regimes.py --out DIR

At ecf8b0e the overlap benchmark (then bench/gpu_overlap.py) timed every impl's calls interleaved in one queued
window per round (impl 1, impl 2, ..., impl 1, ...) instead of a window per impl, and
every time rose (cuBLAS 8B M=8192 598 -> 681 us) while the hidden shares moved by up to
28 points (bench/results/history/overlap-2xh200-w2-interleaved-ecf8b0e.json). Was the GPU
slower (a clock held down by sustained power), or did the host fall behind the queue (a
call's own host gaps inside its event pair)? Per round, for a few shapes:

    windows      a queued window per impl (time_per_call), NVML SM clock per window
    interleaved  every impl's calls alternating in one queued window; the clock over the
                 window, and how long the host took to enqueue it against the sleep that
                 was to cover it (the GPU waits for the host only when the enqueueing
                 outruns the sleep plus the work already queued)

Writes DIR/timing-regimes.json.

What it found at b0805c5 (bench/results/timing-regimes-2xh200.json, 3 rounds, 4 impls):
- ag_gemm 8B M=16384: interleaved, every impl slowed (cuBLAS 2436-2639 -> 2761-2817
  us, fused 2537-2645 -> 2826-2863, the NCCL all-gather 296-304 -> 384-431), the SM clock at 1582-1631 MHz over the window against 1662-1965 MHz in
  the per-impl windows, the board at 591-618 W once warm. Kept busy for seconds the GPU
  runs at its power limit and a lower clock; a window per impl starts each impl after
  an idle moment, at a clock that differs from window to window: the spread of the 70B
  rows. Fused hid 79-94% interleaved.
- gemm_rs 8B M=8192: interleaved, cuBLAS rose (598 -> 609-618 us) and "sequential" more
  (769-778 -> 801-804) while fused stayed (633-639), so hidden read 97-98% against
  81-85% in windows. The host enqueued each window in 46-51 ms, ahead of the GPU (41-43
  ms of sleep, then ~65 ms of work), so this is device time; what differs is what a call
  inherits from the one before it (L2 contents, NCCL's stream handover): not measured.
- gemm_rs 70B M=8192: interleaved at 1521-1584 MHz, hidden 128-134% (windows 50-113%).
- ecf8b0e's 9-impl windows (bench/results/history) rose most at M=512 (gemm_rs 8B
  "sequential" 70.0 -> 111.7 us), where a turn of all nine impls is ~0.6 ms of device
  work, about what the host spends enqueueing it (35-70 us of Python per commlab call):
  probably host gaps inside the event pairs.
commlab.bench.overlap keeps a window per impl (the regime of every recorded result).
"""

from __future__ import annotations

import argparse
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
from commlab.bench import QUEUE_SLEEP_CYCLES, git_commit, time_per_call  # noqa: E402
from commlab.bench.overlap import SHAPES, make_impls  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from gpu_rs_variants import Clocks  # noqa: E402

CASES = [("gemm_rs", "8B", 8192), ("ag_gemm", "8B", 16384), ("gemm_rs", "70B", 8192)]
IMPLS = ("sequential", "comm_only", "gemm_only", "commlab:fused")


def interleaved(comm, fns: dict, iters: int) -> tuple[dict, float, float]:
    """(name -> median us, host ms to enqueue the window, ms of device sleep before it)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    dist.barrier(group=comm.cpu_group)
    ev = {n: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)] for n in fns}
    sleep = torch.cuda.Event(enable_timing=True)
    begin = torch.cuda.Event(enable_timing=True)
    sleep.record()
    torch.cuda._sleep(QUEUE_SLEEP_CYCLES)
    begin.record()
    t0 = time.perf_counter()
    for i in range(iters):
        for n, fn in fns.items():
            ev[n][i][0].record()
            fn()
            ev[n][i][1].record()
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    out = {}
    for n, pairs in ev.items():
        t = torch.tensor([statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)],
                         dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=comm.cpu_group)
        out[n] = float(t.item())
    return out, host_ms, sleep.elapsed_time(begin)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()
    comm = commlab.init(backend="cuda", heap_size="6GiB", scratch_size="256MiB")
    torch.cuda.set_device(comm.device)
    clocks = Clocks(comm.device.index)
    commit = os.environ.get("COMMLAB_COMMIT") or git_commit()
    records = []
    for op, model, m in CASES:
        k, n = SHAPES[op][model]
        every = make_impls(comm, op, m, k, n)
        fns = {name: every[name] for name in IMPLS}
        for rnd in range(args.rounds):
            sep, sep_mhz = {}, {}
            for name, fn in fns.items():
                sep[name], sep_mhz[name], _ = clocks.measure(lambda fn=fn: time_per_call(
                    fn, args.iters, warmup=3, group=comm.cpu_group))
            (inter, host_ms, sleep_ms), inter_mhz, inter_w = clocks.measure(
                lambda fns=fns: interleaved(comm, fns, args.iters))
            for regime, t in (("windows", sep), ("interleaved", inter)):
                hidden = (t["sequential"] - t["commlab:fused"]) / t["comm_only"]
                rec = dict(op=op, model=f"llama3-{model}", m=m, n=n, k=k, round=rnd,
                           regime=regime, times_us={k_: round(v, 1) for k_, v in t.items()},
                           hidden=round(hidden, 4), commit=commit)
                if regime == "windows":
                    rec["sm_mhz"] = {k_: round(v) for k_, v in sep_mhz.items()}
                else:
                    rec.update(sm_mhz=round(inter_mhz), watts=round(inter_w),
                               host_enqueue_ms=round(host_ms, 1), sleep_ms=round(sleep_ms, 1))
                records.append(rec)
                if comm.rank == 0:
                    extra = (f"MHz {' '.join(f'{v:.0f}' for v in sep_mhz.values())}"
                             if regime == "windows" else
                             f"MHz {inter_mhz:.0f} W {inter_w:.0f} host enqueue "
                             f"{host_ms:.1f} ms vs sleep {sleep_ms:.1f} ms")
                    print(f"{op} {model} M={m} r{rnd} {regime:11s} "
                          + " ".join(f"{k_}={v:.1f}" for k_, v in t.items())
                          + f" hidden {hidden:.1%}  {extra}", flush=True)
        del every, fns
    clocks.stop.set()
    if comm.rank == 0:
        path = Path(args.out) / "timing-regimes.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {path}", flush=True)
    commlab.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
