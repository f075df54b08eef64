"""Where the topology explorer puts each node and its label, so no link runs through a
node it does not end at and none crosses a label (tests/test_topology_layout.py checks
every sample and a world across hosts).

Four layouts, picked by what the topology holds:

* hosts (a world across hosts): one box per host side by side, its ranks in a column,
  its NIC on the side facing the next host; net links join NICs between boxes;
* rows (GPUs behind NVSwitches): CPUs on top, each NIC above the GPU it shares a PCIe
  switch with, between the CPU's lines, GPUs, NVSwitches below (labels inside markers);
* sockets (two CPUs, two GPUs each, no switch): a column of GPUs beside each CPU, the
  NIC above its CPU, so socket links fan out sideways;
* ring (the rest): devices around a circle, CPUs below, NICs above.

Label boxes are estimated in data units from a nominal plot of ``PLOT_PX`` pixels.
"""

from __future__ import annotations

import math

PLOT_PX = (730, 470)  # the plot area of the 520 px figure at a 900 px output width
MARKER_PX, CHAR_PX, LINE_PX = 26, 7, 14


def ring_order(t, rank_nodes) -> list:
    devs = t.devices()
    order = [rank_nodes.get(r) for r in sorted(rank_nodes)]
    return sorted(devs, key=lambda n: order.index(n.id) if n.id in order else 99)


def layout(t, rank_nodes) -> tuple[str, dict[str, tuple[float, float]]]:
    """(kind, positions) for topology ``t``."""
    devs = ring_order(t, rank_nodes)
    if t.nodes_of("host"):
        return "hosts", _hosts(t)
    if len(devs) > 2 and t.nodes_of("nvswitch"):
        return "rows", _rows(t, devs)
    cpus = t.nodes_of("cpu")
    if len(cpus) == 2 and len(devs) == 4 and not t.nodes_of("nvswitch"):
        pos = _sockets(t, devs, cpus)
        if pos:
            return "sockets", pos
    return "ring", _ring(t, devs)


def _ring(t, devs) -> dict[str, tuple[float, float]]:
    pos: dict[str, tuple[float, float]] = {}
    r = 1.0 + 0.12 * max(0, len(devs) - 4)
    # two devices side by side: the CPU below then links each without crossing the other
    start = math.pi if len(devs) == 2 else math.pi / 2
    for k, n in enumerate(devs):  # ring order around a circle: a ring is a circle
        a = start - 2 * math.pi * k / max(len(devs), 1)
        pos[n.id] = (r * math.cos(a), r * math.sin(a)) if len(devs) > 1 else (0.0, 0.0)
    for kind, y in (("nvswitch", 0.0), ("cpu", -r - 0.8), ("nic", r + 0.8)):
        group = t.nodes_of(kind)
        step = {"nvswitch": 0.35 * r, "cpu": 1.0, "nic": 2 * r / max(len(group), 1)}[kind]
        for k, n in enumerate(group):
            x = (k - (len(group) - 1) / 2) * step
            yy = y + (0.25 * r if kind == "nvswitch" and k % 2 else 0.0)
            pos[n.id] = (x, yy)
    return pos


def _linked(t, a: str, kind: str) -> list[str]:
    return [o for e in t.edges if a in (e.a, e.b) and e.kind in ("pcie", "smp")
            for o in (e.b if e.a == a else e.a,) if t.node(o).kind == kind
            and (e.path in ("PIX", "PXB", "PHB") or kind == "cpu")]


def _sockets(t, devs, cpus) -> dict[str, tuple[float, float]] | None:
    """CPU k at (±1.8, 0) with its two GPUs in a column nearer the middle (one above,
    one a little below, so the diagonals cross above the socket link), NICs above."""
    mine = {c.id: [d.id for d in devs if c.id in _linked(t, d.id, "cpu")] for c in cpus}
    if sorted(len(v) for v in mine.values()) != [2, 2]:
        return None
    pos: dict[str, tuple[float, float]] = {}
    for side, c in zip((-1, 1), cpus, strict=True):
        pos[c.id] = (1.8 * side, 0.0)
        top, bottom = mine[c.id] if side < 0 else mine[c.id][::-1]
        pos[top], pos[bottom] = (1.0 * side, 1.6), (1.0 * side, -0.8)
    for k, n in enumerate(t.nodes_of("nic")):
        cpu = next(iter(_linked(t, n.id, "cpu")), cpus[k % 2].id)
        pos[n.id] = (pos[cpu][0], 1.6 + 0.9 * k)
    return pos


def _rows(t, devs) -> dict[str, tuple[float, float]]:
    """Switched GPUs in a row, NVSwitches below (every GPU-switch line joins two adjacent
    rows), CPUs on top; a NIC sits above the GPU on its PCIe switch, in the nearest gap
    between the lines that fan out from the CPUs to the GPUs."""
    pos = {n.id: (float(k), 1.0) for k, n in enumerate(devs)}
    sw = t.nodes_of("nvswitch")
    span = len(devs) - 1
    for k, n in enumerate(sw):
        pos[n.id] = ((k + 0.5) * span / len(sw) if len(sw) > 1 else span / 2, -1.5)
    for k, n in enumerate(t.nodes_of("cpu")):
        xs = [pos[g][0] for g in _linked(t, n.id, "gpu") if g in pos]
        pos[n.id] = (sum(xs) / len(xs) if xs else (k + 0.5) * span, 4.2)
    y_nic, taken = 2.1, []
    # where the CPU-GPU lines cross the NIC row: a NIC goes in the gap nearest its GPU
    cross = sorted(pos[c.id][0] + (pos[g][0] - pos[c.id][0]) * (4.2 - y_nic) / 3.2
                   for c in t.nodes_of("cpu") for g in _linked(t, c.id, "gpu") if g in pos)
    gaps = [(a + b) / 2 for a, b in zip(cross, cross[1:], strict=False)]
    gaps += [cross[0] - 0.5, cross[-1] + 0.5] if cross else []
    for k, n in enumerate(t.nodes_of("nic")):
        xs = [pos[g][0] for g in _linked(t, n.id, "gpu") if g in pos]
        x = sum(xs) / len(xs) if xs else (k + 0.5) * span / max(len(t.nodes_of("nic")), 1)
        free = [g for g in gaps if g not in taken] or [x]
        best = min(free, key=lambda g: abs(g - x))
        taken.append(best)
        pos[n.id] = (best, y_nic)
    return pos


def _hosts(t) -> dict[str, tuple[float, float]]:
    """Host boxes side by side; each host's ranks (or GPUs) in a column (two) or a circle,
    its NIC on the side facing the next host (the last host's faces back)."""
    pos: dict[str, tuple[float, float]] = {}
    hosts = t.hosts()
    order = sorted(hosts, key=lambda hid: int(hid[4:]) if hid[4:].isdigit() else hid)
    most = max((len(v) for v in hosts.values()), default=1)
    step = 5.0 if most <= 2 else 6.5 + 0.3 * max(0, most - 4)
    ring = len(order) > 2  # hosts around a circle, NICs inside: chords miss other NICs
    radius = (step + 4.0) / 2 / math.sin(math.pi / len(order)) if ring else 0.0
    for h, hid in enumerate(order):
        a = math.pi / 2 - 2 * math.pi * h / len(order)
        x0, y0 = (radius * math.cos(a), radius * math.sin(a)) if ring else (step * h, 0.0)
        devs = [m for m in hosts[hid] if t.node(m).kind in ("rank", "gpu")]
        cx = x0 if ring else x0 - 0.4  # the column leaves room for the NIC beside it
        r = 0.6 if len(devs) <= 2 else 1.25 + 0.15 * max(0, len(devs) - 4)
        if len(devs) <= 2:  # a column: the one link between them is vertical
            for k, d in enumerate(devs):
                pos[d] = (cx, y0 + (len(devs) - 1) / 2 - k * 1.2)
        else:  # a circle, as one host's ring: no link through another rank
            for k, d in enumerate(devs):
                b = math.pi / 2 + math.pi / len(devs) - 2 * math.pi * k / len(devs)
                pos[d] = (cx + r * math.cos(b), y0 + r * math.sin(b))
        side = 1.0 if h < len(hosts) - 1 else -1.0
        xs = [pos[d][0] for d in devs] or [x0]
        for m in hosts[hid]:
            if not t.node(m).attrs.get("interface"):  # a discovered NIC: in the matrix
                continue
            if ring:
                inset = (r + 2.0) / radius
                pos[m] = (x0 * (1 - inset), y0 * (1 - inset))
            else:
                pos[m] = ((max(xs) + 1.3) if side > 0 else (min(xs) - 1.3), y0)
    return pos


# --- labels ---------------------------------------------------------------------------------


def text_position(kind: str, node_kind: str, xy: tuple[float, float],
                  hosts_around: bool = False) -> str:
    """Where a node's label goes: off the lines that leave it (inside the marker where
    every side has lines or neighbours). ``hosts_around``: hosts on a circle, their NICs
    between the ranks and the links to every other NIC."""
    x = xy[0]
    if kind == "hosts" and node_kind == "nic" and hosts_around:
        return "middle center"
    if node_kind in ("gpu", "rank", "nvswitch") and kind != "rows":
        return "middle center"  # lines leave every side
    if kind == "rows":
        return {"cpu": "top center", "nvswitch": "bottom center"}.get(node_kind,
                                                                      "middle center")
    if kind == "sockets":
        if node_kind == "cpu":
            return "middle left" if x < 0 else "middle right"
        return "top center"
    if kind == "hosts":
        return "bottom center"
    return "top center" if node_kind == "nic" else "bottom center"


def units_per_px(kind: str, positions) -> tuple[float, float]:
    """Data units per pixel on each axis (a circle keeps both equal)."""
    xs = [p[0] for p in positions.values()] or [0.0]
    ys = [p[1] for p in positions.values()] or [0.0]
    if kind == "rows":
        return (max(xs) - min(xs) + 1.6) / PLOT_PX[0], (max(ys) - min(ys) + 1.0) / PLOT_PX[1]
    u = max((max(xs) - min(xs) + 1.6) / PLOT_PX[0], (max(ys) - min(ys) + 1.0) / PLOT_PX[1])
    return u, u


def label_box(x: float, y: float, text: str, where: str, unit: tuple[float, float],
              gap_px: float = MARKER_PX / 2 + 2) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of ``text`` placed ``where`` (plotly's textposition) at (x, y)."""
    lines = text.split("<br>")
    w = max(len(x) for x in lines) * CHAR_PX * unit[0]
    h = len(lines) * LINE_PX * unit[1]
    gx, gy = gap_px * unit[0], gap_px * unit[1]
    vert, horiz = where.split()
    cx = {"left": x - gx - w / 2, "right": x + gx + w / 2}.get(horiz, x)
    cy = {"top": y + gy + h / 2, "bottom": y - gy - h / 2}.get(vert, y)
    return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2


def segment_hits(a, b, box, steps: int = 200) -> bool:
    """Whether the segment a-b passes through ``box``."""
    x0, y0, x1, y1 = box
    for k in range(steps + 1):
        s = k / steps
        x, y = a[0] + s * (b[0] - a[0]), a[1] + s * (b[1] - a[1])
        if x0 < x < x1 and y0 < y < y1:
            return True
    return False
