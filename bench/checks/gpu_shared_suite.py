"""The GPU regression suite (issue 26, item 4): every multi-rank path, checked on a world
of N ranks, which may share one GPU (rank r on device r % device_count).

    python bench/checks/gpu_shared_suite.py --ranks 2 --out $OUT/gpu-shared-w2.json
    python bench/checks/gpu_shared_suite.py --ranks 4 --out $OUT/gpu-shared-w4.json
    python bench/checks/gpu_shared_suite.py --backend cpu --quick --ranks 2   # CI's subset

Worlds (each under a run_world timeout, so nothing hangs forever):
  collectives  every public collective x every algorithm x fp32/bf16/fp16/int32 x sizes
               1, 7, 1000, 4099 (+ 6 MiB on cuda) against gloo on the ranks' CPU copies;
               cuda: CUDA-graph capture + replays with new inputs, all_reduce latency
  kernels      user kernels with commlab.language (ring ping, blockwise-barrier gather);
               a planted hang named by the wait-for graph (GPU: the wait records), released
               by a peer's cl.notify, then an all_reduce; ag_gemm / gemm_rs against torch
  torch        DDP on the "commlab" backend against gloo, parameters step by step
  magic        %dist_start / %%distributed / %dist_stop from a real IPython shell (here)

Writes JSON {commit, checks, failures: [{check, differs}], skips, world_size, backend,
device, heap, latency_us, seconds, ...}; prints a table; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "NVSHMEM_DISABLE_NVLS": "1"}.items():  # NVLink multicast stays off
    os.environ.setdefault(_k, _v)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]  # ranks import these

import _shared_suite_collectives as colls  # noqa: E402
import _shared_suite_kernels as kernels  # noqa: E402
import _shared_suite_torch as torch_checks  # noqa: E402
from _shared_suite_common import Tally  # noqa: E402

SECTIONS = ("collectives", "kernels", "torch", "magic")


def _commit() -> dict:
    """The commit the tree is (COMMLAB_COMMIT first: a copied tree's .git may be stale)."""
    if os.environ.get("COMMLAB_COMMIT"):
        return {"commit": os.environ["COMMLAB_COMMIT"], "dirty": None}

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": os.environ.get("COMMLAB_COMMIT"), "dirty": None}


def _world(name: str, fn, ranks: int, args: tuple, backend: str, timeout: float,
           init: bool = True) -> dict:
    """Run one world; merge its ranks' tallies (checks counted once, failures of every
    rank); a world that fails as a whole is one failure naming what its ranks said."""
    from commlab.testing import WorldError, run_world

    print(f"=== {name}: {ranks} ranks, backend {backend} (limit {timeout:g} s)", flush=True)
    t0 = time.monotonic()
    try:
        results = run_world(fn, ranks, args=args, backend=backend, timeout=timeout, init=init)
    except WorldError as e:
        text = " | ".join(f"rank {r}: {' '.join(v.split())[-1500:]}"
                          for r, v in sorted(e.failures.items()))
        print(f"--- {name}: the world failed after {time.monotonic() - t0:.0f} s", flush=True)
        return {"checks": 1, "failures": [{"check": f"{name} world", "differs": text}],
                "skips": [], "extra": {}}
    merged = {"checks": results[0]["checks"], "failures": [], "skips": results[0]["skips"],
              "extra": results[0]["extra"]}
    for r in results:
        merged["failures"] += r["failures"]
    print(f"--- {name}: {merged['checks']} checks, {len(merged['failures'])} failures "
          f"in {time.monotonic() - t0:.0f} s", flush=True)
    return merged


def run(ranks: int = 2, backend: str = "cuda", quick: bool = False, seed: int | None = None,
        sections: tuple[str, ...] = SECTIONS, timeout: float = 300.0, out: str = "") -> dict:
    """Run the chosen sections; return the JSON record (see the module docstring),
    written to ``out`` after every section (a run stopped midway leaves what it did)."""
    t0 = time.monotonic()
    seed = int(time.time()) % 100000 if seed is None else seed  # fresh data, reproducible
    parts: dict[str, dict] = {}
    worlds = {"collectives": (colls.collectives_world, (seed, quick), True, timeout),
              "kernels": (kernels.kernels_world, (seed, quick), True, timeout),
              "torch": (torch_checks.ddp_world, (seed, backend), False, min(timeout, 200.0))}
    rec: dict = {}
    for name in sections:
        if name in worlds:
            fn, args, init, limit = worlds[name]
            parts[name] = _world(name, fn, ranks, args, backend, limit, init=init)
        else:
            print(f"=== magic: %dist_start -n {ranks} --backend {backend}", flush=True)
            t = Tally(0, "magic")
            torch_checks.check_magic(t, ranks, backend)
            parts[name] = t.result()
        rec = _record(parts, ranks, backend, quick, seed, time.monotonic() - t0)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def _record(parts: dict, ranks: int, backend: str, quick: bool, seed: int,
            seconds: float) -> dict:
    extra = parts.get("collectives", {}).get("extra", {})
    return {
        **_commit(),
        "checks": sum(p["checks"] for p in parts.values()),
        "failures": [f for p in parts.values() for f in p["failures"]],
        "skips": [s for p in parts.values() for s in p["skips"]],
        "world_size": ranks, "backend": backend, "quick": quick, "seed": seed,
        "device": extra.get("device"), "heap": extra.get("heap"),
        "rank_devices": extra.get("rank_devices"),
        "latency_us": extra.get("latency_us"),
        "sections": {k: {"checks": p["checks"], "failures": len(p["failures"])}
                     for k, p in parts.items()},
        "seconds": round(seconds, 1),
    }


def print_table(rec: dict) -> None:
    print(f"\n{'section':<14}{'checks':>8}{'failures':>10}")
    for k, v in rec["sections"].items():
        print(f"{k:<14}{v['checks']:>8}{v['failures']:>10}")
    print(f"{'total':<14}{rec['checks']:>8}{len(rec['failures']):>10}   "
          f"({len(rec['skips'])} skipped, {rec['seconds']} s, {rec['world_size']} ranks, "
          f"{rec['backend']}, device {rec['device']}, heap {rec['heap']})")
    lat = rec.get("latency_us") or {}
    sizes = [k for k in lat if k.isdigit()]
    if sizes:
        print("all_reduce bf16 per call, µs (slowest rank's median):  "
              + "  ".join(f"{k} B: eager {lat[k]['eager']}, graph {lat[k]['graph']}"
                          for k in sizes))
    for s in rec["skips"]:
        print(f"  skip  {s['check']}: {s['reason']}")
    for f in rec["failures"]:
        print(f"  FAIL  {f['check']}: {f['differs'][:300]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="world size (ranks may share a GPU)")
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="a small subset (CI on the CPU)")
    ap.add_argument("--out", default="", help="JSON file to write")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--timeout", type=float, default=300.0, help="per world, seconds")
    a = ap.parse_args(argv)
    sections = tuple(s for s in a.sections.split(",") if s)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    rec = run(a.ranks, a.backend, a.quick, a.seed, sections, a.timeout, a.out)
    print_table(rec)
    if a.out:
        print(f"wrote {a.out}")
    return 1 if rec["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
