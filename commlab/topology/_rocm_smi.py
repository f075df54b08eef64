"""AMD GPUs: parse ``rocm-smi --showtopo`` into the same Topology ``_smi`` builds from
``nvidia-smi topo -m``.

The text has one banner-titled matrix per fact (format as ROCm's ``rocm_smi.py`` prints
it; AMD's MI200/MI300X system-optimization guides show it):

    Weight between two GPUs      15 per xGMI hop, 20 per PCIe segment (0: self)
    Hops between two GPUs        1: linked by xGMI; 2: through one CPU socket; 3: two sockets
    Link Type between two GPUs   XGMI | PCIE (0: self)
    Numa Nodes                   GPU[i] : (Topology) Numa Node: n / Numa Affinity: n

Link counts and speeds are not in the text. A pair with link type XGMI and weight 15 is
one direct xGMI link; its peak is the per-link speed the caller passes (default MI300X:
128 GB/s bidirectional per link, 64 per direction, AMD Instinct MI300X data sheet).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from commlab.topology._model import Edge, Node, Topology

SOURCE = "rocm-smi --showtopo"
XGMI_HOP_WEIGHT = 15  # rocm-smi: each xGMI hop adds 15 to the weight
MI300X_XGMI_GBPS = 64.0  # per link, per direction

_BANNER = re.compile(r"^=+\s*(.*?)\s*=+$")
_NUMA = re.compile(r"^GPU\[?\s*(\d+)\]?\s*:\s*\(Topology\)\s*Numa (Node|Affinity):\s*(-?\d+)")
_MATRICES = {"Weight between two GPUs": "weight", "Hops between two GPUs": "hops",
             "Link Type between two GPUs": "type"}


def run_showtopo(timeout: float = 20.0) -> str:
    exe = shutil.which("rocm-smi")
    if exe is None:
        raise FileNotFoundError("rocm-smi is not on PATH; install ROCm's rocm-smi "
                                "(apt install rocm-smi) to read AMD GPU links")
    return subprocess.run([exe, "--showtopo"], capture_output=True, text=True, check=True,
                          timeout=timeout).stdout


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for ln in text.splitlines():
        m = _BANNER.match(ln.strip())
        if m:
            current = m.group(1)
            out.setdefault(current, [])
        elif current is not None and ln.strip():
            out[current].append(ln.rstrip())
    return out


def _matrix(lines: list[str], title: str) -> dict[tuple[int, int], str]:
    if not lines or not lines[0].split() or not lines[0].split()[0].startswith("GPU"):
        raise ValueError(f"rocm-smi --showtopo: the {title!r} block has no GPU header row; "
                         f"pass the complete text printed by `rocm-smi --showtopo`")
    cols = [int(c[3:]) for c in lines[0].split()]
    cells = {}
    for ln in lines[1:]:
        row = ln.split()
        if not row or not re.fullmatch(r"GPU\d+", row[0]):
            continue
        i = int(row[0][3:])
        if len(row) - 1 != len(cols):
            raise ValueError(f"rocm-smi --showtopo: row GPU{i} of {title!r} has {len(row) - 1} "
                             f"cells for {len(cols)} GPUs; pass the text unwrapped")
        cells.update({(i, j): v for j, v in zip(cols, row[1:], strict=True)})
    return cells


def parse_showtopo(text: str, *, xgmi_gbps: float = MI300X_XGMI_GBPS,
                   name: str = "") -> Topology:
    """Build a Topology from ``rocm-smi --showtopo`` output: GPUs with their NUMA node,
    an "xgmi" edge per xGMI-linked pair, a "pcie" edge (PHB: one socket, SYS: two)
    otherwise."""
    sec = _sections(text)
    if "Link Type between two GPUs" not in sec:
        raise ValueError("not rocm-smi --showtopo output: no 'Link Type between two GPUs' "
                         "block; pass the text printed by `rocm-smi --showtopo`")
    mats = {key: _matrix(sec[title], title) for title, key in _MATRICES.items() if title in sec}
    kinds = mats["type"]
    gpus = sorted({i for i, _ in kinds})
    numa: dict[int, dict] = {}
    for ln in sec.get("Numa Nodes", []):
        m = _NUMA.match(ln.strip())
        if m:
            numa.setdefault(int(m.group(1)), {})[m.group(2).lower()] = int(m.group(3))
    topo = Topology(name=name or f"{len(gpus)} AMD GPUs (rocm-smi)",
                    description="parsed from rocm-smi --showtopo", sources=[SOURCE])
    for i in gpus:
        attrs = {"index": i}
        if i in numa and "node" in numa[i]:
            attrs["numa_node"] = numa[i]["node"]
        topo.nodes.append(Node(f"gpu{i}", "gpu", f"GPU{i}", attrs, SOURCE))
    for i in gpus:
        for j in gpus:
            if j <= i:
                continue
            kind = kinds.get((i, j), "")
            weight = _int(mats.get("weight", {}).get((i, j)))
            hops = _int(mats.get("hops", {}).get((i, j)))
            facts = {k: v for k, v in (("weight", weight), ("hops", hops)) if v is not None}
            if kind == "XGMI":
                direct = weight is None or weight <= XGMI_HOP_WEIGHT
                topo.add_edge(Edge(
                    f"gpu{i}", f"gpu{j}", "xgmi", "XGMI", peak_gbps=xgmi_gbps,
                    source=f"{SOURCE}: XGMI x {xgmi_gbps} GB/s per link (assumed)",
                    attrs={**facts, "link_count": 1 if direct else 0, "direct": direct}))
            elif kind == "PCIE":
                path = "SYS" if (hops or 0) >= 3 else "PHB"
                topo.add_edge(Edge(f"gpu{i}", f"gpu{j}", "pcie", path, source=SOURCE,
                                   attrs=facts))
    return topo


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.lstrip("-").isdigit() else None
