"""The topology explorer's layout: no link through a node it does not end at, none
through a label, room between nodes; every shipped sample and a world across hosts."""

from __future__ import annotations

import math

import pytest

from commlab import topology as T
from commlab.widgets import TopologyGraph
from commlab.widgets import _topology_layout as L


def _through(g) -> list[tuple[str, str, str]]:
    """(a, b, n): drawn edge a-b passes within 0.15 of node n, which it does not end at."""
    out = []
    for e in g.edges:
        (ax, ay), (bx, by) = g.positions[e.a], g.positions[e.b]
        dx, dy = bx - ax, by - ay
        for n, (px, py) in g.positions.items():
            if n in (e.a, e.b):
                continue
            t = max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)))
            if math.hypot(px - ax - t * dx, py - ay - t * dy) < 0.15:
                out.append((e.a, e.b, n))
    return out


def host_world(hosts: int = 2, per: int = 2) -> T.Topology:
    """What ``topology.of_world`` builds for ``hosts`` x ``per`` CPU ranks (rank_info as
    a world across hosts records it)."""
    ranks = [list(range(h * per, (h + 1) * per)) for h in range(hosts)]
    infos = [{"rank": r, "world_size": hosts * per, "backend": "cpu",
              "host": f"host{r // per}-ab12", "pid": 100 + r, "device": "cpu", "cpus": [0, 1],
              "hosts": ranks, "local_rank": r % per,
              "net": {"ifname": f"clabh{r // per}", "addr": f"10.77.9.{r // per + 1}",
                      "speed_mbps": -1}} for r in range(hosts * per)]
    return T.world_topology(infos)


CASES = [*T.samples(), "hosts-2x2", "hosts-2x1", "hosts-2x4", "hosts-3x2", "hosts-4x4"]


def _graph(name: str) -> TopologyGraph:
    if name.startswith("hosts-"):
        h, per = name[6:].split("x")
        return TopologyGraph(host_world(int(h), int(per)))
    return TopologyGraph(T.sample(name))


@pytest.mark.parametrize("name", CASES)
def test_topology_samples_draw_no_link_through_another_node_or_a_label(name):
    g = _graph(name)
    assert _through(g) == []
    assert g.crossings() == []
    close = [(a, b) for a in g.positions for b in g.positions
             if a < b and math.dist(g.positions[a], g.positions[b]) < 0.5]
    assert close == []  # room for each node's label


def test_a_world_across_hosts_draws_a_box_per_host_around_its_ranks_and_nic():
    g = _graph("hosts-2x2")
    boxes = g.host_boxes()
    assert sorted(boxes) == ["host0", "host1"]
    for hid, members in g.topology.hosts().items():
        x0, y0, x1, y1 = boxes[hid]
        assert all(x0 < g.positions[m][0] < x1 and y0 < g.positions[m][1] < y1 for m in members)
    assert boxes["host0"][2] < boxes["host1"][0]  # side by side, apart
    drawn = {(e.a, e.b, e.kind) for e in g.edges}
    assert ("nic0", "nic1", "net") in drawn and ("rank0", "rank1", "shm") in drawn
    assert not any(k == "net" and a.startswith("rank") for a, _, k in drawn)  # via the NICs


@pytest.mark.parametrize("name", CASES)
def test_node_markers_do_not_overlap(name):
    g = _graph(name)
    ux, uy = L.units_per_px(g.kind, g.positions)
    nodes = [n for n in g.topology.nodes if n.id in g.positions]
    half = {n.id: g.marker_size(n) / 2 for n in nodes}
    hits = [(a.id, b.id) for a in nodes for b in nodes if a.id < b.id
            and abs(g.positions[a.id][0] - g.positions[b.id][0]) < (half[a.id] + half[b.id]) * ux
            and abs(g.positions[a.id][1] - g.positions[b.id][1]) < (half[a.id] + half[b.id]) * uy]
    assert hits == []


def test_a_cuda_world_across_hosts_joins_each_hosts_discovered_topology():
    infos = [{"rank": r, "world_size": 4, "backend": "cuda", "host": f"node{r // 2}",
              "pid": r, "device": f"cuda:{r % 2}", "cpus": [], "hosts": [[0, 1], [2, 3]],
              "local_rank": r % 2, "net": {"ifname": "ib0", "addr": f"10.1.0.{r // 2 + 1}"}}
             for r in range(4)]
    t = T.world_topology(infos, host=[T.sample("2xh200-nv18"), T.sample("2xh200-nv18")])
    assert t.ranks == {0: "h0.gpu0", 1: "h0.gpu1", 2: "h1.gpu0", 3: "h1.gpu1"}
    assert t.edge("h1.gpu0", "h1.gpu1").kind == "nvlink" and t.edge("nic0", "nic1").kind == "net"
    assert sorted(t.hosts()) == ["host0", "host1"] and "h1.gpu1" in t.hosts()["host1"]
    g = TopologyGraph(t)
    assert g.kind == "hosts" and _through(g) == [] and g.crossings() == []
    assert {(e.a, e.b) for e in g.edges} >= {("h0.gpu0", "h0.gpu1"), ("nic0", "nic1")}
