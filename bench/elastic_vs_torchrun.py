"""A rank dies in a DDP loop: torchrun's restart from a checkpoint against commlab's shrink.

The same loop (``bench/_elastic_ddp_loop.py``: a 3-layer MLP in DDP, 4 CPU ranks, rank 2
SIGKILLs itself before step ``--kill-at``) runs, alternately, ``--reps`` times each:

- ``torchrun:restart``: ``torchrun --max-restarts 1 --monitor-interval 0.1``; DDP on gloo,
  a checkpoint after every step (the best case for a restart); the agent ends every
  worker and starts 4 new ones, which load the checkpoint.
- ``commlab:shrink``: ``python -m commlab.run``; DDP's buckets through ``commlab.all_reduce``
  (a comm hook); the survivors catch RankLostError, ``commlab.shrink()``, re-wrap DDP and
  redo the step on 3 ranks.
- ``commlab:shrink+join`` (only once ``commlab.grow`` exists): as shrink, then the
  launcher's replacement joins (``--max-restarts 1``) and the world is 4 again.

Per run: ``recover`` = from the SIGKILL to the slowest rank's first correct all_reduce
after the event; every step must appear once in the final world. Records go to
``bench/results/elastic-vs-torchrun-cpu.json`` and a figure to ``.svg``.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 python bench/elastic_vs_torchrun.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = str(ROOT / "bench" / "_elastic_ddp_loop.py")
OUT = ROOT / "bench" / "results" / "elastic-vs-torchrun-cpu"
COLORS = {"torchrun:restart": "#2c3e50", "commlab:shrink": "#c0392b",
          "commlab:shrink+join": "#e67e22"}


def _command(impl: str, ranks: int, out: str, args: list[str]) -> list[str]:
    py = [sys.executable, "-m"]
    if impl == "torchrun:restart":
        return py + ["torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                     "--max-restarts", "1", "--monitor-interval", "0.1", LOOP, out,
                     "--mode", "restart", *args]
    restarts = "1" if impl.endswith("join") else "0"
    return py + ["commlab.run", "--nproc-per-node", str(ranks), "--max-restarts", restarts,
                 LOOP, out, "--mode", "shrink", *(["--join"] if impl.endswith("join") else []),
                 *args]


def run_once(impl: str, ranks: int, steps: int, kill_at: int) -> dict:
    """One run; the event's timings and checks."""
    with tempfile.TemporaryDirectory(prefix="commlab-elastic-bench-") as out:
        env = {**os.environ, "COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        t0 = time.monotonic()
        proc = subprocess.run(_command(impl, ranks, out, ["--steps", str(steps), "--kill-at",
                                                          str(kill_at)]),
                              env=env, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{impl} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        killed = float(Path(out, "killed").read_text())
        recs = [json.loads(p.read_text()) for p in Path(out).glob("[0-9]*.json")]
    # the world right after the event: torchrun's new workers, commlab's survivors
    after = [r for r in recs if r["t_ok"] is not None and not r.get("joined")]
    final = max(r["world_end"] for r in recs)
    # no step lost or repeated: the final world's ranks ran each step once after the event
    seen = sorted({s for r in recs for s, _, _ in r["steps"]})
    once = all(len({s for s, _, _ in r["steps"]}) == len(r["steps"]) for r in recs)
    ev = {"impl": impl, "world_size": ranks, "world_after": final, "wall_s": wall,
          "recover_s": max(r["t_ok"] for r in after) - killed,
          "steps_ok": seen == list(range(seen[0], steps)) and once and
          (impl != "torchrun:restart" or seen[0] == kill_at),
          "step_ms": statistics.median(r["step_ms_median"] for r in recs
                                       if r["step_ms_median"])}
    if impl == "torchrun:restart":
        ev["restarted_s"] = min(r["t_start"] for r in recs) - killed  # new workers begin
    else:
        ev["detect_s"] = max(r["t_error"] for r in after) - killed
        ev["shrunk_s"] = max(r["t_shrunk"] for r in after) - killed
    joined = [r for r in recs if r.get("joined")]
    if joined:  # the replacement: started, admitted (grown world's check), first step done
        ev["newcomer_started_s"] = max(r["t_start"] for r in joined) - killed
        ev["grown_s"] = max(r["t_ok_grown"] for r in after) - killed
        ev["join_s"] = max(r["t_joined"] for r in joined) - killed
        ev["join_bytes"] = max(r["join_bytes"] for r in joined)
    return ev


def _summary(impl: str, metric: str, values: list[float], ranks: int, commit: str,
             note: str) -> dict:
    return {"metric": metric, "impl": impl, "world_size": ranks,
            "median_ms": 1000 * statistics.median(values), "min_ms": 1000 * min(values),
            "max_ms": 1000 * max(values), "n": len(values),
            "device": f"cpu x{os.cpu_count()}", "commit": commit,
            "python": platform.python_version(), "note": note}


def _svg(events: list[dict]) -> str:
    """Seconds from SIGKILL to the first correct collective, one dot per run, log scale."""
    import math

    impls = [i for i in COLORS if any(e["impl"] == i for e in events)]
    w, h, pad, left = 620, 300, 50, 170
    vals = [e["recover_s"] for e in events]
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))

    def px(v):
        return left + (math.log10(v) - lo) / (hi - lo or 1) * (w - left - pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="20" text-anchor="middle">a rank SIGKILLed in a DDP loop, '
             f'4 CPU ranks: seconds to the first correct collective</text>']
    for e10 in range(lo, hi + 1):
        x = px(10 ** e10)
        parts.append(f'<line x1="{x:.0f}" x2="{x:.0f}" y1="{pad}" y2="{h - pad}" '
                     f'stroke="#ddd"/><text x="{x:.0f}" y="{h - pad + 16}" '
                     f'text-anchor="middle">{10 ** e10:g} s</text>')
    x1 = px(1.0)
    parts.append(f'<line x1="{x1:.0f}" x2="{x1:.0f}" y1="{pad - 8}" y2="{h - pad}" '
                 f'stroke="#888" stroke-dasharray="4,3"/><text x="{x1 + 4:.0f}" '
                 f'y="{pad - 10}" fill="#555">goal 1 s</text>')
    row = (h - 2 * pad) / max(1, len(impls))
    for i, impl in enumerate(impls):
        y = pad + row * (i + 0.5)
        mine = [e["recover_s"] for e in events if e["impl"] == impl]
        med = statistics.median(mine)
        parts.append(f'<text x="{left - 10}" y="{y + 4:.0f}" text-anchor="end" '
                     f'fill="{COLORS[impl]}">{impl}</text>')
        parts += [f'<circle cx="{px(v):.1f}" cy="{y:.1f}" r="4" fill="{COLORS[impl]}" '
                  f'fill-opacity="0.6"/>' for v in mine]
        parts.append(f'<line x1="{px(med):.1f}" x2="{px(med):.1f}" y1="{y - 12:.0f}" '
                     f'y2="{y + 12:.0f}" stroke="{COLORS[impl]}" stroke-width="3"/>'
                     f'<text x="{px(med):.1f}" y="{y - 16:.0f}" text-anchor="middle" '
                     f'fill="{COLORS[impl]}">median {med:.2f} s</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kill-at", type=int, default=8)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import commlab
    from commlab.bench import git_commit

    impls = ["torchrun:restart", "commlab:shrink"]
    if hasattr(commlab, "grow"):
        impls.append("commlab:shrink+join")
    events = []
    for rep in range(args.reps):
        for impl in impls:  # alternate, so the box's load hits each alike
            ev = run_once(impl, args.ranks, args.steps, args.kill_at)
            events.append({"rep": rep, **ev})
            print(json.dumps(events[-1]), flush=True)
    commit = git_commit(ROOT)
    records = []
    for impl in impls:
        mine = [e for e in events if e["impl"] == impl]
        records.append(_summary(impl, "sigkill_to_first_correct_collective",
                                [e["recover_s"] for e in mine], args.ranks, commit,
                                "slowest rank of the world after the event; torchrun: new "
                                "workers, checkpoint loaded; commlab: survivors shrunk"))
        records.append(_summary(impl, "step_time", [e["step_ms"] / 1000 for e in mine],
                                args.ranks, commit, "median DDP step before the event "
                                "(torchrun: gloo all_reduce; commlab: commlab.all_reduce "
                                "hook, Triton interpreter)"))
        if any("join_s" in e for e in mine):
            records.append(_summary(impl, "newcomer_start_to_training",
                                    [e["join_s"] - e["newcomer_started_s"] for e in mine],
                                    args.ranks, commit,
                                    "the replacement's script start (after its module "
                                    "imports, torch included) to its first step done "
                                    "(commlab import, init(join=True), grow, DDP's parameter "
                                    f"broadcast of {mine[0]['join_bytes']} bytes)"))
            records.append(_summary(impl, "sigkill_to_newcomer_training",
                                    [e["join_s"] for e in mine], args.ranks, commit,
                                    "includes the launcher's replacement start"))
    if "commlab:shrink+join" not in impls:
        records.append({"metric": "join", "impl": "commlab:shrink+join",
                        "note": "not measured: commlab.grow does not exist at this commit"})
    records.append({"metric": "events", "events": events})
    OUT.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    OUT.with_suffix(".svg").write_text(_svg(events))
    for r in records:
        if "median_ms" in r:
            print(f"{r['impl']:22s} {r['metric']:38s} median {r['median_ms']:8.0f} ms "
                  f"(min {r['min_ms']:.0f}, max {r['max_ms']:.0f}, n={r['n']})")
    bad = [e for e in events if not e["steps_ok"]]
    if bad:
        raise SystemExit(f"steps lost or repeated in {len(bad)} runs: {bad}")


if __name__ == "__main__":
    main()
