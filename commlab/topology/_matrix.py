"""``topo -m`` style matrix of a topology: devices (GPUs or ranks, then NICs) against
each other, the path class in each cell, then CPU/NUMA affinity columns."""

from __future__ import annotations

LEGEND = {
    "X": "self",
    "NV#": "a bonded set of # NVLinks",
    "XGMI": "AMD xGMI (Infinity Fabric) links",
    "PIX": "at most one PCIe bridge",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (typically the CPU)",
    "NODE": "PCIe and the interconnect between host bridges in one NUMA node",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)",
    "SHM": "shared memory between processes on one host (CPU backend)",
    "NET": "a network between hosts",
}


def topo_matrix(topology) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """(labels, cells, extra column names, extra cells) for the matrix view."""
    devs = topology.devices() + topology.nodes_of("nic")
    labels = [_short(n) for n in devs]
    cells = [[topology.path_class(a.id, b.id) or "-" for b in devs] for a in devs]
    extra_cols = ["CPU Affinity", "NUMA Affinity"]
    extra = [[str(n.attrs.get("cpu_affinity", n.attrs.get("cpus", ""))),
              str(n.attrs.get("numa_node", ""))] for n in devs]
    return labels, cells, extra_cols, extra


def _short(n) -> str:
    if n.kind == "gpu":
        return f"GPU{n.attrs.get('index', n.id[3:])}"
    if n.kind == "nic":
        return f"NIC{n.id[3:]}"
    return n.label or n.id


def format_matrix(topology) -> str:
    """The matrix as text, like ``nvidia-smi topo -m``."""
    labels, cells, cols, extra = topo_matrix(topology)
    w = max([len(x) for x in labels] + [5]) + 2
    out = [" " * w + "".join(f"{x:<{w}}" for x in labels) + "  ".join(cols)]
    for lab, row, ex in zip(labels, cells, extra, strict=True):
        out.append(f"{lab:<{w}}" + "".join(f"{c:<{w}}" for c in row) + "  ".join(ex))
    return "\n".join(out)
