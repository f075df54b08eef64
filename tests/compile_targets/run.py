"""Run the whole matrix: the uncached jobs split over worker processes (two by default,
the heavy GEMM variants dealt first), the figures gathered in matrix order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.compile_targets.matrix import KNOWN_FAILURES, NOT_GPU, TARGETS, VARIANTS, pairs

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "compile-targets.json"
COMMAND = ".venv/bin/python -m tests.compile_targets --write"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "commlab-compile-targets"


def _cost(variant: str) -> int:
    return 10 if variant.startswith(("gemm", "ag_gemm")) else 1


def run(jobs: int = 2, cache: Path | None = None,
        only: list[tuple[str, str]] | None = None) -> tuple[list[dict], float]:
    """(one record per matrix pair, or per pair of ``only``, wall seconds)."""
    cache = cache or cache_dir()
    want = pairs() if only is None else [p for p in pairs() if p in set(only)]
    todo = sorted(want, key=lambda p: -_cost(p[0]))
    shares: list[list[str]] = [[] for _ in range(max(1, jobs))]
    loads = [0] * len(shares)
    for v, t in todo:  # greedy: the next job to the least loaded worker
        i = loads.index(min(loads))
        shares[i].append(f"{v}@{t}")
        loads[i] += _cost(v)
    env = {k: val for k, val in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.compile_targets.worker", str(cache),
                               *share], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for share in shares if share]
    got: dict[tuple[str, str], dict] = {}
    errors = []
    for p in procs:
        out, err = p.communicate()
        for line in out.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                got[(rec["variant"], rec["target"])] = rec
        if p.returncode:
            errors.append(err[-3000:])
    if errors:
        raise RuntimeError("a compile worker failed:\n" + "\n".join(errors))
    missing = [p for p in want if p not in got]
    if missing:
        raise RuntimeError(f"no result for {missing[:5]} (of {len(missing)})")
    return [got[p] for p in want], time.perf_counter() - t0


def document(records: list[dict]) -> dict:
    """The committed JSON: figures per (variant, target), no timings (they vary per run)."""
    import triton  # only for its version; nothing is compiled here

    keep = ("variant", "target", "kernel", "num_warps", "num_stages", "constexprs", "ok",
            "fits", "error", "registers", "spill_bytes", "shared_bytes", "shared_limit", "detail")
    return {
        "about": "commlab kernels compiled for each target without a GPU (Triton's ptxas / "
                 "AMD LLVM); registers: per thread (AMD: VGPRs + AGPRs), spill_bytes: local "
                 "memory per thread (AMD: scratch), shared_bytes: shared memory / LDS per block",
        "regenerate": COMMAND,
        "triton": triton.__version__,
        "targets": {n: {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size,
                        "gpus": t.gpus, "shared_limit": t.shared_limit}
                    for n, t in TARGETS.items()},
        "not_compiled": NOT_GPU,
        "known_failures": {f"{v}@{t}": why for (v, t), why in KNOWN_FAILURES.items()},
        "results": [{k: r[k] for k in keep if k in r} for r in records],
    }


def table(records: list[dict]) -> str:
    """Variants down, targets across: registers/spill bytes/shared KiB, or FAIL."""
    by = {(r["variant"], r["target"]): r for r in records}
    w = max(len(v) for v in VARIANTS) + 2
    lines = [f"{'variant':<{w}}" + "".join(f"{t:>18}" for t in TARGETS),
             f"{'':<{w}}" + "".join(f"{'regs/spill/shKiB':>18}" for _ in TARGETS)]
    for v in VARIANTS:
        cells = []
        for t in TARGETS:
            r = by[(v, t)]
            if not r["ok"]:
                cells.append("FAIL")
            else:
                cell = f"{r['registers']}/{r['spill_bytes']}/{r['shared_bytes'] / 1024:.0f}"
                cells.append(cell + ("" if r["fits"] else " >LIM"))
        lines.append(f"{v:<{w}}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)
