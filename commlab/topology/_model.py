"""The topology model: nodes (GPUs, CPUs/NUMA nodes, NVSwitches, NICs, ranks) and edges
(NVLink, PCIe, shared memory), each fact carrying where it came from.

A ``Topology`` is plain data: it saves to JSON and loads anywhere, so a topology recorded
on a GPU cluster can be explored on a laptop.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = "commlab.topology/1"
NODE_KINDS = ("gpu", "cpu", "nvswitch", "nic", "rank", "host")  # host: a box of nodes
EDGE_KINDS = ("nvlink", "xgmi", "pcie", "shm", "smp", "net")
# nvidia-smi topo -m path classes, nearest first (X = self, NV# = bonded NVLinks)
PCIE_CLASSES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")


def write_json(path, data: dict) -> Path:
    """Write ``data`` as indented JSON, creating the folder (topologies, linkbench results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


@dataclass
class Link:
    """One physical link of an edge (an NVLink lane group, say)."""

    index: int
    state: str = "up"  # "up" | "down" | "unknown"
    speed_gbps: float = 0.0  # GB/s per direction
    version: int | None = None
    remote: str = ""  # remote PCI bus id as NVML reports it (FFFFFFFF behind NVSwitch)


@dataclass
class Node:
    id: str  # "gpu0", "cpu0", "nvswitch0", "nic0", "rank1"
    kind: str
    label: str = ""
    attrs: dict = field(default_factory=dict)
    source: str = ""


@dataclass
class Edge:
    a: str
    b: str
    kind: str  # "nvlink" | "xgmi" | "pcie" | "shm" | "net"
    path: str = ""  # topo -m class: "NV18", "PIX", "SYS", "SHM" ...
    links: list[Link] = field(default_factory=list)
    p2p: dict = field(default_factory=dict)  # capability -> "ok" | reason
    peak_gbps: float = 0.0  # per direction
    measured_gbps: float | None = None
    source: str = ""
    attrs: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)

    @property
    def links_up(self) -> int:
        return sum(1 for lk in self.links if lk.state == "up")


@dataclass
class Topology:
    """Nodes, edges and ``ranks`` (rank -> node id of the device it drives)."""

    name: str
    description: str = ""
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    ranks: dict[int, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # references for the numbers
    meta: dict = field(default_factory=dict)

    # -- lookups -------------------------------------------------------------------------
    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"topology {self.name!r} has no node {node_id!r}; nodes: "
                       f"{', '.join(n.id for n in self.nodes)}")

    def nodes_of(self, kind: str) -> list[Node]:
        return [n for n in self.nodes if n.kind == kind]

    def edge(self, a: str, b: str) -> Edge | None:
        """The most direct edge between ``a`` and ``b`` (NVLink/xGMI before PCIe), or None."""
        found = [e for e in self.edges if {e.a, e.b} == {a, b}]
        order = {k: i for i, k in enumerate(("nvlink", "xgmi", "shm", "pcie", "net"))}
        found.sort(key=lambda e: order.get(e.kind, 9))
        return found[0] if found else None

    def hosts(self) -> dict[str, list[str]]:
        """Host node id -> the ids of the nodes on it (their ``attrs["host_node"]``); {}
        when the topology has no host nodes (one machine)."""
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes_of("host")}
        for n in self.nodes:
            if n.attrs.get("host_node") in out and n.kind != "host":
                out[n.attrs["host_node"]].append(n.id)
        return out

    def devices(self) -> list[Node]:
        """The nodes that ranks run on: GPUs if any, else rank nodes."""
        return self.nodes_of("gpu") or self.nodes_of("rank")

    def path_class(self, a: str, b: str) -> str:
        """topo -m style class between two nodes ("X" for the node itself)."""
        if a == b:
            return "X"
        e = self.edge(a, b)
        return e.path if e is not None else ""

    def add_edge(self, edge: Edge) -> Edge:
        self.edges.append(edge)
        return edge

    # -- persistence ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["ranks"] = {str(k): v for k, v in self.ranks.items()}
        return {"schema": SCHEMA, **d}

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        schema = d.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise ValueError(f"topology schema {schema!r} is not {SCHEMA!r}; re-record it "
                             f"with this commlab version (commlab.topology.discover().save())")
        nodes = [Node(**n) for n in d.get("nodes", [])]
        edges = []
        for e in d.get("edges", []):
            e = dict(e)
            e["links"] = [Link(**lk) for lk in e.get("links", [])]
            edges.append(Edge(**e))
        return cls(name=d["name"], description=d.get("description", ""), nodes=nodes,
                   edges=edges, ranks={int(k): v for k, v in d.get("ranks", {}).items()},
                   sources=list(d.get("sources", [])), meta=dict(d.get("meta", {})))

    def save(self, path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> Topology:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no topology file at {path}; record one with "
                                    f"commlab.topology.discover().save('{path}')")
        return cls.from_dict(json.loads(path.read_text()))

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        parts = [f"{v} {k}{'s' if v > 1 else ''}" for k, v in kinds.items()]
        return f"{self.name}: {', '.join(parts)}, {len(self.edges)} edges"
