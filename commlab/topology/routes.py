"""Which links a collective uses: the (source rank -> destination rank) flows of each
commlab algorithm, mapped onto a topology's nodes for highlighting.

    ring          each step rank r sends to r+1: W flows, every link carries N/W per step
    one_shot      every rank reads every peer's whole input: W·(W-1) flows
    two_shot      reduce-scatter then all-gather, both all pairs: W·(W-1) flows, N/W each
    all_to_all    direct pairs: chunk j of rank i goes straight to rank j
    broadcast     every rank reads the source: W-1 flows out of one link
"""

from __future__ import annotations

from dataclasses import dataclass

ROUTES = {
    "ring": "ring all-reduce: rank r -> r+1, 2(W-1) steps of N/W",
    "one_shot": "one-shot all-reduce: every rank reads every peer's N",
    "two_shot": "two-shot all-reduce: all pairs, N/W per pair, twice",
    "all_gather": "all-gather (direct pull): every rank reads every peer's N/W",
    "all_to_all": "all-to-all (direct pairs): chunk j of rank i goes to rank j",
    "broadcast": "broadcast from rank 0: every rank reads rank 0",
}


@dataclass
class Route:
    name: str
    description: str
    flows: list[tuple[int, int]]  # (source rank, destination rank)
    order: list[int]  # ranks in the order the algorithm visits them (the ring order)

    def node_flows(self, topology) -> list[tuple[str, str]]:
        """The flows as (source node, destination node) of ``topology``."""
        ids = rank_nodes(topology)
        return [(ids[a], ids[b]) for a, b in self.flows if a in ids and b in ids]

    def edge_load(self, topology) -> dict[tuple[str, str], int]:
        """How many flows cross each edge (undirected key, as ``Edge.key``)."""
        out: dict[tuple[str, str], int] = {}
        for a, b in self.node_flows(topology):
            for key in _hops(topology, a, b):
                out[key] = out.get(key, 0) + 1
        return out


def rank_nodes(topology) -> dict[int, str]:
    """rank -> node id: the topology's map, else devices in order."""
    if topology.ranks:
        return dict(topology.ranks)
    return {i: n.id for i, n in enumerate(topology.devices())}


def _hops(topology, a: str, b: str) -> list[tuple[str, str]]:
    """The edges a flow crosses: the direct edge, or — for a pair linked through NVSwitch
    — each GPU's links to every switch (traffic is striped over all of them)."""
    e = topology.edge(a, b)
    if e is None:
        return []
    via = e.attrs.get("via")
    if via:
        hops = []
        for sw in (n.id for n in topology.nodes if n.kind == via):
            ea, eb = topology.edge(a, sw), topology.edge(sw, b)
            if ea is not None and eb is not None:
                hops += [ea.key, eb.key]
        if hops:
            return hops
    return [e.key]


def route(name: str, world_size: int, src: int = 0) -> Route:
    """The flows of collective algorithm ``name`` on ``world_size`` ranks."""
    w = world_size
    ring = list(range(w))
    if name not in ROUTES:
        raise ValueError(f"unknown route {name!r}; choose one of {', '.join(ROUTES)}")
    if name == "ring":
        flows = [(r, (r + 1) % w) for r in range(w)] if w > 1 else []
    elif name == "broadcast":
        flows = [(src, r) for r in range(w) if r != src]
    else:
        flows = [(j, i) for i in range(w) for j in range(w) if i != j]
    return Route(name, ROUTES[name], flows, ring)
