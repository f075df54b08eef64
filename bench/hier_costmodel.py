"""The cost model's hierarchical all_reduce checked against runs on 2 simulated hosts x 2
ranks (CPU backend; needs root for the namespaces, ``tests/_hosts.py``).

    sudo .venv/bin/python bench/hier_costmodel.py                 # writes the files below
    .venv/bin/python bench/hier_costmodel.py --sizes 4KiB 2MiB --reps 3

``commlab.costmodel.measure_levels`` times, in one world, the hierarchical all_reduce and
its two levels alone (commlab's all_reduce on one host's 2 ranks; gloo's all_reduce
between the 2 hosts, of the whole message and of the half the split path sends);
``check_hierarchical`` fits each level (alpha, beta), projects the hierarchical schedule
for this same 2x2 machine and sets it beside what it measured. Writes
``bench/results/hier-costmodel-2x2.json`` ({records, check}) and ``.svg`` (measured and
projected against bytes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("4KiB", "64KiB", "256KiB", "1MiB", "2MiB", "4MiB", "16MiB")
OUT = ROOT / "bench" / "results" / "hier-costmodel-2x2"


def _worker(out_dir: str, sizes: list[int], reps: int) -> None:
    import commlab
    from commlab import costmodel

    comm = commlab.init()
    records = costmodel.measure_levels(comm, sizes, reps)
    if comm.rank == 0:
        Path(out_dir, "records.json").write_text(json.dumps(records))
    commlab.finalize()


def _svg(check: dict, records: list[dict]) -> str:
    """Measured hierarchical, projected (per call, per step) and the levels, log-log."""
    w, h, pad = 620, 360, 60
    rows = check["rows"]
    series = {"measured commlab:hier": [(r["bytes"], r["measured_us"]) for r in rows],
              "projected (latency per call)": [(r["bytes"], r["projected_us"]) for r in rows],
              "projected (latency per step)": [(r["bytes"], r["projected_step_us"])
                                               for r in rows],
              "measured inside (1 host)": sorted((r["bytes"], r["time_us"]) for r in records
                                                 if r["impl"] == "inside"),
              "measured between (gloo)": sorted((r["bytes"], r["time_us"]) for r in records
                                                if r["impl"] == "between")}
    colors = ("#c0392b", "#2980b9", "#8e44ad", "#7f8c8d", "#27ae60")
    dashes = ("", "6,3", "2,3", "", "")
    pts = [p for s in series.values() for p in s]
    lx0, lx1 = math.log2(min(p[0] for p in pts)), math.log2(max(p[0] for p in pts))
    ly0 = math.log10(min(p[1] for p in pts)) - 0.1
    ly1 = math.log10(max(p[1] for p in pts)) + 0.1

    def px(b):
        return pad + (math.log2(b) - lx0) / (lx1 - lx0 or 1) * (w - 2 * pad - 150)

    def py(t):
        return h - pad - (math.log10(t) - ly0) / (ly1 - ly0) * (h - 2 * pad)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="11">', f'<rect width="{w}" height="{h}" '
           f'fill="white"/>', f'<text x="{w / 2}" y="18" text-anchor="middle">all_reduce '
           f'fp32, 2 simulated hosts x 2 ranks (CPU): measured vs the alpha-beta '
           f'projection, µs</text>']
    last = -1e9
    for b in sorted({r["bytes"] for r in rows}):
        if px(b) - last < 45:  # labels would touch
            continue
        last = px(b)
        label = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        out.append(f'<text x="{px(b):.0f}" y="{h - pad + 16}" text-anchor="middle">'
                   f'{label}</text>')
    for e in range(math.ceil(ly0), math.floor(ly1) + 1):
        out.append(f'<line x1="{pad}" x2="{w - pad - 150}" y1="{py(10 ** e):.0f}" '
                   f'y2="{py(10 ** e):.0f}" stroke="#ddd"/><text x="{pad - 6}" '
                   f'y="{py(10 ** e) + 4:.0f}" text-anchor="end">{10 ** e:g}</text>')
    for k, (name, s) in enumerate(series.items()):
        path = " ".join(f"{px(b):.1f},{py(t):.1f}" for b, t in s)
        if name.startswith("measured between"):  # two messages per size: points, no line
            out += [f'<circle cx="{px(b):.1f}" cy="{py(t):.1f}" r="3" fill="{colors[k]}"/>'
                    for b, t in s]
        else:
            out.append(f'<polyline points="{path}" fill="none" stroke="{colors[k]}" '
                       f'stroke-width="2" stroke-dasharray="{dashes[k]}"/>')
        out.append(f'<text x="{w - pad - 140}" y="{pad + 16 * k}" fill="{colors[k]}">'
                   f'{name}</text>')
    return "\n".join([*out, "</svg>"]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from commlab.bench import git_commit, parse_size

    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        return _worker(args.worker, sizes, args.reps)
    from bench._hosts_world import run_on_two_hosts
    from commlab import costmodel

    records = run_on_two_hosts(__file__, ["--reps", str(args.reps), "--sizes", *args.sizes])
    commit = git_commit(ROOT)
    for r in records:
        r.update(device="cpu, 2 simulated hosts x 2 ranks, gloo over veth", commit=commit)
    check = costmodel.check_hierarchical(records)
    OUT.with_suffix(".json").write_text(json.dumps({"records": records, "check": check},
                                                   indent=1) + "\n")
    OUT.with_suffix(".svg").write_text(_svg(check, records))
    i, x = check["inside"], check["between"]
    print(f"inside: alpha {i['alpha_us']:.0f} µs, beta {i['beta_gbps']:.3f} GB/s (two_shot); "
          f"between: alpha {x['alpha_us']:.0f} µs/step, beta {x['beta_gbps']:.3f} GB/s (ring)")
    print(f"{'bytes':>10} {'measured µs':>12} {'projected µs':>13} {'ratio':>6} {'per step':>9}")
    for r in check["rows"]:
        print(f"{r['bytes']:>10} {r['measured_us']:>12.0f} {r['projected_us']:>13.0f} "
              f"{r['ratio']:>6.2f} {r['projected_step_us']:>9.0f}")


if __name__ == "__main__":
    main()
