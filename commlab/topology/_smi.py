"""Fallback when NVML is missing: parse ``nvidia-smi topo -m``.

The matrix gives one path class per device pair (X, NV#, PIX, PXB, PHB, NODE, SYS),
then each GPU's CPU and NUMA affinity; the "NIC Legend" maps NIC# to device names.
Link counts come from NV#; per-link speed is not in the text, so NVLink peaks are
estimated from a speed the caller passes (default NVLink 4: 26.562 GB/s per link).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from commlab.topology._model import Edge, Node, Topology

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|[a-z]+\d*_\d+)$")
SOURCE = "nvidia-smi topo -m"


def run_topo_m(timeout: float = 20.0) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi is not on PATH; install the NVIDIA driver "
                                "utilities or use NVML (pip install nvidia-ml-py)")
    return subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, check=True,
                          timeout=timeout).stdout


def parse_topo_m(text: str, *, nvlink_gbps: float = 26.562, name: str = "") -> Topology:
    """Build a Topology from ``nvidia-smi topo -m`` output."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header_i = next((i for i, ln in enumerate(lines)
                     if "GPU0" in ln.split() and "X" not in ln.split()), None)
    if header_i is None:
        raise ValueError("not nvidia-smi topo -m output: no header row naming GPU0; pass the "
                         "text printed by `nvidia-smi topo -m`")
    header = lines[header_i].split()
    devices = [t for t in header if _DEVICE.match(t)]
    legend = _nic_legend(lines)
    rows: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    for ln in lines[header_i + 1:]:
        cells = ln.split()
        if not cells or cells[0] not in devices:
            if rows and not ln.strip():
                break  # the blank line before the legend
            continue
        rows[cells[0]] = cells[1:1 + len(devices)]
        extras[cells[0]] = cells[1 + len(devices):]
    missing = [d for d in devices if d not in rows]
    if missing:
        raise ValueError(f"topo -m text has no row for {', '.join(missing)}; pass the complete "
                         f"output of `nvidia-smi topo -m`")
    topo = Topology(name=name or f"{sum(d.startswith('GPU') for d in devices)} GPUs (topo -m)",
                    description="parsed from nvidia-smi topo -m", sources=[SOURCE])
    ids = {}
    for d in devices:
        if d.startswith("GPU"):
            i = int(d[3:])
            ex = extras.get(d, [])
            attrs: dict[str, object] = {"index": i}
            if ex:
                attrs["cpu_affinity"] = ex[0]
            if len(ex) > 1 and ex[1].isdigit():
                attrs["numa_node"] = int(ex[1])
            ids[d] = f"gpu{i}"
            topo.nodes.append(Node(ids[d], "gpu", f"GPU{i}", attrs, SOURCE))
        else:
            k = sum(1 for n in topo.nodes if n.kind == "nic")
            dev = legend.get(d, d)
            ids[d] = f"nic{k}"
            topo.nodes.append(Node(ids[d], "nic", f"NIC{k} {dev}", {"device": dev}, SOURCE))
    for i, a in enumerate(devices):
        for j in range(i + 1, len(devices)):
            b = devices[j]
            cls = rows[a][j] if j < len(rows[a]) else ""
            m = re.fullmatch(r"NV(\d+)", cls)
            if m:
                n = int(m.group(1))
                topo.add_edge(Edge(ids[a], ids[b], "nvlink", cls, [], {}, round(n * nvlink_gbps, 3),
                                   source=f"{SOURCE}: {cls} x {nvlink_gbps} GB/s per link "
                                          f"(assumed)", attrs={"link_count": n}))
            elif cls:
                topo.add_edge(Edge(ids[a], ids[b], "pcie", cls, source=SOURCE))
    return topo


def _nic_legend(lines: list[str]) -> dict[str, str]:
    out = {}
    for ln in lines:
        m = re.match(r"^\s*(NIC\d+):\s*(\S+)", ln)
        if m:
            out[m.group(1)] = m.group(2)
    return out
