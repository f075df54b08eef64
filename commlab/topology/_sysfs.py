"""What NVML does not describe, read from Linux sysfs: NUMA nodes (CPUs), NICs, and the
PCIe path class between two PCI devices (the X/PIX/PXB/PHB/NODE/SYS of ``topo -m``)."""

from __future__ import annotations

import os
from pathlib import Path

from commlab.topology._model import Edge, Node, Topology

SOURCE = "sysfs"


def numa_nodes(root: str = "/") -> list[Node]:
    base = Path(root, "sys/devices/system/node")
    out = []
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        n = int(d.name[4:])
        cpus = (d / "cpulist").read_text().strip() if (d / "cpulist").exists() else ""
        out.append(Node(f"cpu{n}", "cpu", f"CPU / NUMA {n}", {"numa_node": n, "cpus": cpus},
                        f"{SOURCE}: {d}/cpulist"))
    return out


def pci_path(bus_id: str, root: str = "/") -> list[str]:
    """The PCI hierarchy above a device: ["pci0000:17", "0000:17:00.0", "0000:18:00.0"]."""
    bus_id = bus_id.lower()[-12:]
    p = Path(root, "sys/bus/pci/devices", bus_id)
    if not p.exists():
        return []
    parts = os.path.realpath(p).split("/")
    i = next((k for k, s in enumerate(parts) if s.startswith("pci")), None)
    return parts[i:] if i is not None else []


def pci_numa(bus_id: str, root: str = "/") -> int | None:
    p = Path(root, "sys/bus/pci/devices", bus_id.lower()[-12:], "numa_node")
    try:
        n = int(p.read_text())
    except (OSError, ValueError):
        return None
    return max(n, 0)


def path_class(a: list[str], b: list[str], numa_a=None, numa_b=None) -> str:
    """topo -m class between two devices given their ``pci_path``s."""
    if not a or not b:
        return ""
    if a == b:
        return "X"
    if a[0] != b[0]:  # different host bridges
        return "NODE" if numa_a is not None and numa_a == numa_b else "SYS"
    common = 0
    for x, y in zip(a[:-1], b[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:  # only the root complex in common
        return "PHB"
    bridges = max(len(a) - 1 - common, len(b) - 1 - common) + 1
    return "PIX" if bridges <= 1 else "PXB"


def nics(root: str = "/") -> list[Node]:
    """RDMA devices (/sys/class/infiniband) and physical Ethernet ports with a PCI device."""
    out: list[Node] = []
    seen: set[str] = set()
    for cls in ("infiniband", "net"):
        for d in sorted(Path(root, "sys/class", cls).glob("*")):
            dev = d / "device"
            if not dev.exists():
                continue  # virtual interface (lo, bridges, veth)
            bus = os.path.basename(os.path.realpath(dev))
            if ":" not in bus or bus in seen:
                continue
            seen.add(bus)
            out.append(Node(f"nic{len(out)}", "nic", f"NIC{len(out)} {d.name}",
                            {"device": d.name, "pci_bus_id": bus, "class": cls,
                             "numa_node": pci_numa(bus, root)}, f"{SOURCE}: {d}"))
    return out


def add_host(topo: Topology, root: str = "/") -> None:
    """Add NUMA nodes, NICs and their edges to a topology whose GPUs carry pci_bus_id."""
    cpus = numa_nodes(root)
    topo.nodes.extend(cpus)
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            topo.add_edge(Edge(a.id, b.id, "smp", "SYS", source=f"{SOURCE}: NUMA nodes"))
    devices = [n for n in topo.nodes if n.kind == "gpu"] + nics(root)
    topo.nodes.extend(n for n in devices if n.kind == "nic")
    for d in devices:
        bus = d.attrs.get("pci_bus_id", "")
        numa = d.attrs.get("numa_node")
        if numa is None and bus:
            numa = pci_numa(bus, root)
            if numa is not None:
                d.attrs["numa_node"] = numa
        cpu = f"cpu{numa}" if numa is not None else (cpus[0].id if cpus else None)
        if cpu is not None and any(c.id == cpu for c in cpus):
            topo.add_edge(Edge(d.id, cpu, "pcie", "PHB", source=f"{SOURCE}: numa_node of {bus}"))
    paths = {d.id: pci_path(d.attrs.get("pci_bus_id", ""), root) for d in devices}
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            if a.kind == "gpu" and b.kind == "gpu":
                continue  # NVML's answer (NVLink or its own PCIe class) is already there
            cls = path_class(paths[a.id], paths[b.id], a.attrs.get("numa_node"),
                             b.attrs.get("numa_node"))
            if cls:
                topo.add_edge(Edge(a.id, b.id, "pcie", cls,
                                   source=f"{SOURCE}: PCI hierarchy of both devices"))
