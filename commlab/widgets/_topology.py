"""The topology explorer: a graph of devices and links, a ``topo -m`` matrix, per-link
detail on click, the route a chosen collective takes, and live NVLink traffic.

``TopologyGraph`` is the data model (positions, which edges to draw, colours, detail
text): plain Python, tested without a browser. ``TopologyExplorer`` is the widget."""

from __future__ import annotations

import html
import math

from commlab.topology import LEGEND, Topology, route, topo_matrix
from commlab.topology.routes import rank_nodes
from commlab.widgets._style import figure_widget

KIND_COLOR = {"gpu": "#76b900", "rank": "#4c78a8", "cpu": "#9d755d", "nvswitch": "#e45756",
              "nic": "#72b7b2"}
EDGE_COLOR = {"nvlink": "#76b900", "xgmi": "#ed1c24", "pcie": "#9d755d", "shm": "#4c78a8",
              "smp": "#bab0ac", "net": "#72b7b2"}
CLASS_COLOR = {"X": "#eeeeee", "PIX": "#fdd49e", "PXB": "#fdbb84", "PHB": "#fc8d59",
               "NODE": "#ef6548", "SYS": "#d7301f", "SHM": "#9ecae1", "NET": "#c6dbef"}
EDGE_NAME = {"nvlink": "NVLink", "pcie": "PCIe", "shm": "shared memory", "smp": "CPU socket link",
             "net": "network"}
HIGHLIGHT = "#ff7f0e"


class TopologyGraph:
    def __init__(self, topology: Topology):
        self.topology = topology
        self.positions = self._layout()
        self.edges = [e for e in topology.edges if self._drawn(e)]
        self.route_name = ""
        self.route_load: dict[tuple[str, str], int] = {}
        self.rates: dict[tuple[str, str], float] = {}  # live GB/s per edge key

    # -- layout ----------------------------------------------------------------------------
    def _layout(self) -> dict[str, tuple[float, float]]:
        t = self.topology
        devs = t.devices()
        order = [rank_nodes(t).get(r) for r in sorted(rank_nodes(t))]
        devs = sorted(devs, key=lambda n: order.index(n.id) if n.id in order else 99)
        self.layered = len(devs) > 2 and bool(t.nodes_of("nvswitch"))
        if self.layered:
            return self._layers(devs)
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

    def _layers(self, devs) -> dict[str, tuple[float, float]]:
        """Switched GPUs in rows, so no line runs through a node it does not end at:
        CPUs on top, each NIC above the GPU it shares a PCIe switch with, the GPUs, the
        NVSwitches below (every GPU-switch line then joins two adjacent rows)."""
        t = self.topology
        pos = {n.id: (float(k), 1.0) for k, n in enumerate(devs)}
        sw = t.nodes_of("nvswitch")
        span = len(devs) - 1
        for k, n in enumerate(sw):
            pos[n.id] = ((k + 0.5) * span / len(sw) if len(sw) > 1 else span / 2, -1.5)

        def near(n, paths) -> list[float]:  # x of the GPUs n reaches through ``paths``
            return [pos[o][0] for e in t.edges if n.id in (e.a, e.b) and e.path in paths
                    for o in (e.b if e.a == n.id else e.a,) if o in pos and
                    t.node(o).kind == "gpu"]

        for kind, y, paths in (("nic", 2.5, ("PIX", "PXB")), ("cpu", 4.2, ("PHB",))):
            group = t.nodes_of(kind)
            for k, n in enumerate(group):
                xs = near(n, paths)
                pos[n.id] = (sum(xs) / len(xs) if xs else (k + 0.5) * span / len(group), y)
        return pos

    def _drawn(self, e) -> bool:
        """Draw direct links; leave switch-routed pairs (drawn as hops) and far PCIe
        classes to the matrix, where they stay readable."""
        if e.a not in self.positions or e.b not in self.positions:
            return False
        if e.attrs.get("via"):
            return False
        kinds = {self.topology.node(e.a).kind, self.topology.node(e.b).kind}
        if e.kind == "pcie" and kinds != {"gpu"} and e.path not in ("PIX", "PXB", "PHB"):
            return False
        return True

    # -- state -------------------------------------------------------------------------------
    def set_route(self, name: str) -> None:
        """Highlight the edges collective ``name`` uses ("" clears)."""
        self.route_name = name
        if not name:
            self.route_load = {}
            return
        w = len(rank_nodes(self.topology))
        self.route_load = route(name, w).edge_load(self.topology)

    def set_rates(self, rates: dict[tuple[str, str], float]) -> None:
        self.rates = dict(rates)

    def short_label(self, n) -> str:
        if n.kind == "gpu":
            return f"GPU{n.attrs.get('index', n.id[3:])}"
        if n.kind == "nvswitch":
            return f"SW{n.id[8:]}"
        if n.kind == "nic":
            return f"NIC{n.id[3:]}"
        return n.label.split(" / ")[0] if n.kind == "cpu" else (n.label or n.id)

    def text_position(self, n) -> str:
        """Where a node's label goes: off the lines that leave it."""
        if not self.layered:
            return "bottom center"
        return {"cpu": "top center", "nvswitch": "bottom center"}.get(n.kind, "middle right")

    def edge_style(self, e) -> tuple[str, float, str]:
        """(colour, width, label) of an edge now."""
        label = e.path
        if e.measured_gbps:  # what a copy reached, not the link's own rate
            label = f"{e.path} (copy measured {e.measured_gbps:.3g} GB/s)"
        if e.key in self.rates:
            gbps = self.rates[e.key]
            frac = min(1.0, gbps / e.peak_gbps) if e.peak_gbps else 0.0
            return _heat(frac), 2 + 8 * frac, f"{e.path} {gbps:.1f} GB/s"
        if self.route_load:
            load = self.route_load.get(e.key, 0)
            if load:
                return HIGHLIGHT, 3 + 2 * load, f"{e.path} ×{load}"
            return "#dddddd", 1.0, ""
        width = 1.5 + min(6.0, (e.peak_gbps or 0) / 80)
        return EDGE_COLOR.get(e.kind, "#999999"), width, label

    # -- text --------------------------------------------------------------------------------
    def edge_detail(self, index: int) -> dict:
        e = self.edges[index]
        d = {"edge": f"{e.a} — {e.b}", "kind": e.kind, "class": e.path,
             "link peak GB/s per direction (spec)": e.peak_gbps or "unknown",
             "measured copy GB/s (a benchmark's rate, not the link's)":
                 e.measured_gbps if e.measured_gbps is not None else "—",
             "links up": f"{e.links_up} of {len(e.links)}" if e.links else "—",
             "p2p": ", ".join(f"{k}: {v}" for k, v in e.p2p.items()) or "—",
             "source": e.source}
        if e.measured_gbps and e.peak_gbps:
            d["measured / link peak"] = f"{100 * e.measured_gbps / e.peak_gbps:.0f}%"
        d.update({k: v for k, v in e.attrs.items()})
        if e.key in self.rates:
            d["live GB/s"] = round(self.rates[e.key], 2)
        return d

    def edge_detail_html(self, index: int) -> str:
        e = self.edges[index]
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                       f"<td>{html.escape(str(v))}</td></tr>"
                       for k, v in self.edge_detail(index).items())
        links = ""
        if e.links:
            links = ("<table class='commlab-links'><tr><th>link</th><th>state</th><th>GB/s</th>"
                     "<th>version</th><th>remote</th></tr>" + "".join(
                         f"<tr><td>{lk.index}</td><td>{lk.state}</td><td>{lk.speed_gbps}</td>"
                         f"<td>{lk.version}</td><td>{html.escape(lk.remote)}</td></tr>"
                         for lk in e.links) + "</table>")
        return f"<table class='commlab-edge'>{rows}</table>{links}"

    def matrix_html(self) -> str:
        labels, cells, cols, extra = topo_matrix(self.topology)
        head = "".join(f"<th>{html.escape(x)}</th>" for x in labels + cols)
        body = ""
        for lab, row, ex in zip(labels, cells, extra, strict=True):
            tds = "".join(f"<td style='background:{_cell_color(c)};text-align:center;"
                          f"padding:2px 6px'>{html.escape(c)}</td>" for c in row)
            tds += "".join(f"<td style='padding:2px 6px'>{html.escape(x)}</td>" for x in ex)
            body += f"<tr><th>{html.escape(lab)}</th>{tds}</tr>"
        used = {c for row in cells for c in row}
        legend = "".join(f"<li><b>{k}</b> = {html.escape(v)}</li>" for k, v in LEGEND.items()
                         if k in used or (k == "NV#" and any(c.startswith("NV") for c in used)))
        return (f"<table class='commlab-topo-matrix' style='border-collapse:collapse'>"
                f"<tr><th></th>{head}</tr>{body}</table><ul style='font-size:90%'>{legend}</ul>")


def _cell_color(c: str) -> str:
    return CLASS_COLOR.get(c, "#d9f0a3" if c.startswith("NV") else "#ffffff")


def _heat(frac: float) -> str:
    """Green (idle) to red (at peak)."""
    r = int(40 + 215 * frac)
    g = int(180 - 140 * frac)
    return f"rgb({r},{g},60)"


class TopologyExplorer:
    """``TopologyExplorer(topology)``: display it (it is an ipywidgets VBox via ``.widget``
    and displays itself in a notebook)."""

    def __init__(self, topology: Topology, *, title: str | None = None, route: str = ""):
        import ipywidgets as W
        import plotly.graph_objects as go

        self.model = TopologyGraph(topology)
        g = self.model
        fig = go.Figure()  # built in full (route included), then a widget: figure_widget
        for e in g.edges:
            (x0, y0), (x1, y1) = g.positions[e.a], g.positions[e.b]
            fig.add_scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip",
                            showlegend=False, line={"color": "#999", "width": 2})
        mids = [((g.positions[e.a][0] + g.positions[e.b][0]) / 2,
                 (g.positions[e.a][1] + g.positions[e.b][1]) / 2) for e in g.edges]
        fig.add_scatter(x=[m[0] for m in mids], y=[m[1] for m in mids], mode="markers+text",
                        text=[e.path for e in g.edges], textposition="top center",
                        marker={"size": 9, "color": "rgba(255,255,255,0.9)",
                                "line": {"width": 1, "color": "#666"}},
                        hovertext=[f"{e.a}–{e.b}: {e.path}, click for detail" for e in g.edges],
                        hoverinfo="text", name="links", showlegend=False)
        for kind in sorted({e.kind for e in g.edges}):  # the edge colours' legend
            fig.add_scatter(x=[None], y=[None], mode="lines", name=EDGE_NAME.get(kind, kind),
                            line={"color": EDGE_COLOR.get(kind, "#999999"), "width": 4},
                            hoverinfo="skip")
        nodes = [n for n in topology.nodes if n.id in g.positions]
        rank_of = {v: k for k, v in rank_nodes(topology).items()}
        fig.add_scatter(
            x=[g.positions[n.id][0] for n in nodes], y=[g.positions[n.id][1] for n in nodes],
            mode="markers+text", textposition=[g.text_position(n) for n in nodes],
            showlegend=False,
            text=[g.short_label(n) + (f" r{rank_of[n.id]}" if n.id in rank_of and n.kind != "rank"
                                      else "") for n in nodes],
            hovertext=[f"{n.label}<br>{n.kind}<br>source: {n.source}" for n in nodes],
            hoverinfo="text", marker={"size": 26, "symbol": "square",
                                      "color": [KIND_COLOR.get(n.kind, "#999") for n in nodes]})
        xs = [p[0] for p in g.positions.values()] or [0.0]
        # rows: room on the right for the last node's label ("middle right")
        xrange = {"range": [min(xs) - 0.6, max(xs) + 1.0]} if g.layered else {}
        fig.update_layout(title=title or topology.name, height=520, margin={"l": 10, "r": 10,
                          "t": 40, "b": 10}, xaxis={"visible": False, **xrange},
                          # rows (switched GPUs) use the width; a circle stays round
                          yaxis={"visible": False} if g.layered else
                          {"visible": False, "scaleanchor": "x"},
                          legend={"x": 1.0, "xanchor": "left", "y": 1, "title": {"text": "links"}},
                          paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
                          font={"color": "#888"})
        self.figure = fig
        self._mid_trace = fig.data[len(g.edges)]
        self.detail = W.HTML("<i>click a link's marker for per-link detail</i>")
        self.matrix = W.HTML(g.matrix_html())
        self.route_picker = W.Dropdown(options=[("(no route)", "")] + [(k, k) for k in
                                       ("ring", "one_shot", "two_shot", "all_gather",
                                        "all_to_all", "broadcast")],
                                       value=route, description="route")
        first = topology.description.splitlines()[0] if topology.description else ""
        self.status = W.HTML(f"<small>{html.escape(first)}</small>")
        if route:
            self.show_route(route)  # redraws
        else:
            self._redraw()
        self.figure = figure_widget(fig, scrollZoom=True)
        self._mid_trace = self.figure.data[len(g.edges)]
        self._mid_trace.on_click(self._on_click)
        self.route_picker.observe(lambda ch: self.show_route(ch["new"]), names="value")
        self.widget = W.VBox([W.HBox([self.route_picker, self.status]), self.figure,
                              self.matrix, self.detail])

    def _on_click(self, trace, points, state) -> None:
        if points.point_inds:
            self.select_edge(points.point_inds[0])

    def select_edge(self, index: int) -> None:
        self.detail.value = self.model.edge_detail_html(index)

    def show_route(self, name: str) -> None:
        self.model.set_route(name)
        w = len(rank_nodes(self.model.topology))
        self.status.value = f"<b>{name}</b>: {route(name, w).description}" if name else ""
        self._redraw()

    def show_error(self, message: str) -> None:
        """Say in the explorer why live rates stopped (``NvlinkSampler``'s ``on_error``)."""
        self.status.value = f"<small style='color:#b00'>{html.escape(message)}</small>"

    def set_rates(self, rates) -> None:
        """Paint live GB/s per edge key (from ``NvlinkSampler``); batched by the pump."""
        from commlab.widgets._pump import PUMP

        self.model.set_rates(rates)
        PUMP.submit((id(self), "rates"), self._redraw)

    def _redraw(self) -> None:
        with self.figure.batch_update():
            for k, e in enumerate(self.model.edges):
                color, width, _ = self.model.edge_style(e)
                self.figure.data[k].line.color = color
                self.figure.data[k].line.width = width
            labels = [self.model.edge_style(e)[2] for e in self.model.edges]
            if len(labels) > 16 and not self.model.rates:
                labels = [""] * len(labels)  # a dense graph: hover the markers instead
            self._mid_trace.text = labels

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)
