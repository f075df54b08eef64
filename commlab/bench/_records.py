"""Benchmark records: sizes, nccl-tests bandwidth formulas, link peaks, result files.

A record is one (op, impl, dtype, bytes, mode) measurement:

    {op, impl, dtype, bytes, world_size, time_us, algbw_gbps, busbw_gbps, device, commit, mode}

``bytes`` follows nccl-tests: the message for all_reduce and broadcast, the *total*
(gathered output / scattered input / exchanged buffer) for all_gather, reduce_scatter
and all_to_all. ``algbw = bytes / time``; ``busbw = algbw · factor`` with the factor
below, so busbw compares with the link's line rate whatever the op.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from commlab import _config

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
MODES = ("eager", "graph")

# Per-direction NVLink line rate of one GPU, GB/s (1e9 B/s), when commlab.topology
# cannot tell: links x per-link rate. H200/H100 SXM: NV18, 18 x 26.5625 GB/s (the
# rate measured on the 2xH200 machine, bench/results/link-ceiling-2xh200.txt);
# A100 SXM: NV12, 12 x 25 GB/s.
LINK_PEAK_GBPS = {"H200": 478.0, "H100": 478.0, "A100": 300.0, "B200": 900.0}


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw ratio for ``op`` on ``world_size`` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")


@dataclass
class Record:
    op: str
    impl: str
    dtype: str
    bytes: int
    world_size: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    device: str
    commit: str
    mode: str

    @classmethod
    def measured(cls, *, op, impl, dtype, nbytes, world_size, time_us, device, commit, mode):
        algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
        return cls(op, impl, dtype, int(nbytes), world_size, float(time_us), algbw,
                   algbw * bus_factor(op, world_size), device, commit, mode)

    def key(self) -> tuple:
        return (self.op, self.impl, self.dtype, self.bytes, self.world_size, self.mode)


# --- sizes ------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1000**2, "MIB": 1 << 20, "G": 1 << 30, "GB": 1000**3, "GIB": 1 << 30}


def parse_size(text) -> int:
    """'8', '64KiB', '4MiB', '1GiB' (also K/M/G = binary, KB/MB/GB = decimal) -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot read size {text!r}; write e.g. 8, 64KiB, 4MiB or 1GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def size_range(lo, hi, factor: int = 2) -> list[int]:
    """Sizes lo, lo·factor, … and hi itself (the largest size asked for is always
    measured, also off the factor's grid), in bytes."""
    lo, hi = parse_size(lo), parse_size(hi)
    if lo <= 0 or hi < lo or factor < 2:
        raise ValueError(f"size range needs 0 < min <= max and factor >= 2, "
                         f"got {lo}, {hi}, {factor}")
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def bw_unit(gbps_values) -> tuple[str, float]:
    """("GB/s", 1) or, when every value is below 1 GB/s (the CPU backend), ("MB/s",
    1000): the unit that shows a value instead of 0.00."""
    vals = [v for v in gbps_values if v]
    return ("MB/s", 1000.0) if vals and max(vals) < 1 else ("GB/s", 1.0)


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


# --- where the numbers come from --------------------------------------------------


def device_name(comm) -> str:
    if comm.backend == "cuda":
        import torch

        return torch.cuda.get_device_name(comm.device)
    return f"cpu ({os.cpu_count()} cores)"


def machine_tag(comm) -> str:
    """File-name tag of this machine: "2xh200", "8xh100", "cpu"."""
    if comm.backend != "cuda":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(comm.device)
    short = next((k for k in LINK_PEAK_GBPS if k in name.upper()), name.split()[-1])
    return f"{torch.cuda.device_count()}x{short.lower()}"


def link_peak_gbps(comm) -> float | None:
    """Per-direction peak of one GPU's links, GB/s: commlab.topology if it knows, else the
    table above by device name; None on the CPU backend (no link to compare with)."""
    if comm.backend != "cuda":
        return None
    try:
        from commlab import topology

        peaks = [e.peak_gbps for e in topology.discover().edges
                 if e.kind == "nvlink" and e.peak_gbps]
        if peaks:
            return float(max(peaks))
    except Exception:  # topology is optional; fall back to the documented table
        pass
    name = device_name(comm).upper()
    return next((v for k, v in LINK_PEAK_GBPS.items() if k in name), None)


def git_commit(root: Path | None = None) -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes); ``COMMLAB_COMMIT``
    wins (a copied working tree on a GPU machine may carry a stale .git)."""
    if _config.get("COMMLAB_COMMIT"):
        return _config.get("COMMLAB_COMMIT")
    root = root or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                             capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("-dirty" if sha and dirty.strip() else "")


# --- files ------------------------------------------------------------------------


def results_path(out_dir, comm) -> Path:
    return Path(out_dir) / f"{machine_tag(comm)}-w{comm.world_size}.json"


def load_records(path) -> list[Record]:
    with open(path) as f:
        return [Record(**r) for r in json.load(f)]


def write_records(path, records: list[Record]) -> Path:
    """Merge ``records`` into the JSON list at ``path``: a new measurement replaces the
    old one with the same (op, impl, dtype, bytes, world_size, mode)."""
    path = Path(path)
    merged = {r.key(): r for r in (load_records(path) if path.exists() else [])}
    merged.update((r.key(), r) for r in records)
    rows = sorted(merged.values(), key=lambda r: (r.op, r.dtype, r.mode, r.impl, r.bytes))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    tmp.replace(path)
    return path


def format_table(records: list[Record], peak_gbps: float | None = None) -> str:
    """A plain-text table, one line per record, grouped by op and size."""
    unit, k = bw_unit([r.busbw_gbps for r in records] + [r.algbw_gbps for r in records])
    head = (f"{'op':<15}{'mode':<6}{'dtype':<9}{'bytes':>10}  {'impl':<28}{'time µs':>10}"
            f"{'algbw ' + unit:>12}{'busbw ' + unit:>12}")
    if peak_gbps:
        head += f"{'% peak':>8}"
    lines = [head, "-" * len(head)]
    for r in sorted(records, key=lambda r: (r.op, r.mode, r.dtype, r.bytes, r.time_us)):
        line = (f"{r.op:<15}{r.mode:<6}{r.dtype:<9}{fmt_bytes(r.bytes):>10}  {r.impl:<28}"
                f"{r.time_us:>10.1f}{r.algbw_gbps * k:>12.2f}{r.busbw_gbps * k:>12.2f}")
        if peak_gbps:
            line += f"{100 * r.busbw_gbps / peak_gbps:>7.1f}%"
        lines.append(line)
    lines.append("busbw = bytes/time · f, f = 2(n-1)/n all_reduce; (n-1)/n all_gather, "
                 "reduce_scatter, all_to_all (total bytes); 1 broadcast")
    return "\n".join(lines)
