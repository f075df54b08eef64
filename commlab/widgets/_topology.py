"""The topology explorer: a graph of devices and links, a ``topo -m`` matrix, per-link
detail on click, the route a chosen collective takes, and live NVLink traffic.

``TopologyGraph`` is the data model (positions, which edges to draw, colours, detail
text): plain Python, tested without a browser. ``TopologyExplorer`` is the widget."""

from __future__ import annotations

import html

from commlab.topology import LEGEND, Topology, route, topo_matrix
from commlab.topology.routes import rank_nodes
from commlab.widgets import _topology_layout as L
from commlab.widgets._style import figure_widget

KIND_COLOR = {"gpu": "#76b900", "rank": "#4c78a8", "cpu": "#9d755d", "nvswitch": "#e45756",
              "nic": "#72b7b2", "host": "#bbbbbb"}
EDGE_COLOR = {"nvlink": "#76b900", "xgmi": "#ed1c24", "pcie": "#9d755d", "shm": "#4c78a8",
              "smp": "#bab0ac", "net": "#72b7b2"}
CLASS_COLOR = {"X": "#eeeeee", "PIX": "#fdd49e", "PXB": "#fdbb84", "PHB": "#fc8d59",
               "NODE": "#ef6548", "SYS": "#d7301f", "SHM": "#9ecae1", "NET": "#c6dbef"}
EDGE_NAME = {"nvlink": "NVLink", "xgmi": "AMD xGMI", "pcie": "PCIe", "shm": "shared memory",
             "smp": "CPU socket link", "net": "network"}
HIGHLIGHT = "#ff7f0e"


class TopologyGraph:
    def __init__(self, topology: Topology):
        self.topology = topology
        self.positions = self._layout()
        self.edges = [e for e in topology.edges if self._drawn(e)]
        self._mids: dict[tuple[str, str], tuple[float, float]] = {}
        self.route_name = ""
        self.route_load: dict[tuple[str, str], int] = {}
        self.rates: dict[tuple[str, str], float] = {}  # live GB/s per edge key

    # -- layout ----------------------------------------------------------------------------
    def _layout(self) -> dict[str, tuple[float, float]]:
        self.kind, pos = L.layout(self.topology, rank_nodes(self.topology))
        self.layered = self.kind == "rows"
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
        if n.kind == "nic":  # a world's NIC: its interface and address
            return (f"{n.attrs['ifname']}<br>{n.attrs['addr']}" if n.attrs.get("addr")
                    else f"NIC{n.id[3:]}")
        return n.label.split(" / ")[0] if n.kind == "cpu" else (n.label or n.id)

    def text_position(self, n) -> str:
        """Where a node's label goes: off the lines that leave it (inside the marker
        where every side has lines)."""
        around = self.kind == "hosts" and len(self.topology.nodes_of("host")) > 2
        return L.text_position(self.kind, n.kind, self.positions[n.id], around)

    def node_text(self, n) -> str:
        rank_of = {v: k for k, v in rank_nodes(self.topology).items()}
        text = self.short_label(n)
        if n.kind == "rank" and self.text_position(n) == "middle center":
            return text.replace(" ", "<br>", 1)  # "rank<br>3": a small square holds it
        if n.id in rank_of and n.kind != "rank":
            sep = "<br>" if self.text_position(n) == "middle center" else " "
            text += f"{sep}r{rank_of[n.id]}"
        return text

    def marker_size(self, n) -> float:
        """Big enough to hold its label when the label sits inside."""
        if self.text_position(n) != "middle center":
            return L.MARKER_PX
        lines = self.node_text(n).split("<br>")
        return max(L.MARKER_PX, max(len(x) for x in lines) * L.CHAR_PX + 8,
                   len(lines) * L.LINE_PX + 6)

    def host_boxes(self) -> dict[str, tuple[float, float, float, float]]:
        """Host id -> (x0, y0, x1, y1) around the nodes on it (worlds across hosts)."""
        ux, uy = L.units_per_px(self.kind, self.positions)
        out = {}
        for hid, members in self.topology.hosts().items():
            ms = [self.topology.node(m) for m in members if m in self.positions]
            if not ms:
                continue
            hx = [self.marker_size(n) / 2 * ux + 0.35 for n in ms]  # marker + a margin
            hy = [self.marker_size(n) / 2 * uy + 0.35 for n in ms]
            xy = [self.positions[n.id] for n in ms]
            out[hid] = (min(p[0] - h for p, h in zip(xy, hx, strict=True)),
                        min(p[1] - h for p, h in zip(xy, hy, strict=True)) - 0.3,
                        max(p[0] + h for p, h in zip(xy, hx, strict=True)),
                        max(p[1] + h for p, h in zip(xy, hy, strict=True)))
        return out

    def label_boxes(self) -> dict[str, tuple[float, float, float, float]]:
        """Each label outside its marker (nodes by id, edge markers as "a-b") in data units."""
        unit = L.units_per_px(self.kind, self.positions)
        out = {}
        for n in self.topology.nodes:
            where = self.text_position(n) if n.id in self.positions else "middle center"
            if where != "middle center":
                x, y = self.positions[n.id]
                out[n.id] = L.label_box(x, y, self.node_text(n), where, unit)
        for e, text in zip(self.edges, self.edge_labels(), strict=True):
            if text:
                x, y = self.mid_point(e)
                out[f"{e.a}-{e.b}"] = L.label_box(x, y, text, "top center", unit, gap_px=6)
        return out

    def mid_point(self, e) -> tuple[float, float]:
        """Where edge ``e``'s marker (and label) sits: its middle, or a third of the way
        along when another link runs through the label there."""
        if e.key not in self._mids:
            unit = L.units_per_px(self.kind, self.positions)
            (ax, ay), (bx, by) = self.positions[e.a], self.positions[e.b]
            text = self.edge_style(e)[2] or e.path
            for t in (0.5, 0.3, 0.7):
                x, y = ax + t * (bx - ax), ay + t * (by - ay)
                box = L.label_box(x, y, text, "top center", unit, gap_px=6)
                if not any(L.segment_hits(self.positions[o.a], self.positions[o.b], box)
                           for o in self.edges if o is not e):
                    break
            self._mids[e.key] = (x, y)
        return self._mids[e.key]

    def crossings(self) -> list[tuple[str, str, str]]:
        """(a, b, label): drawn edge a-b runs through that label's box."""
        boxes = self.label_boxes()
        return [(e.a, e.b, k) for e in self.edges for k, box in boxes.items()
                if k != f"{e.a}-{e.b}" and
                L.segment_hits(self.positions[e.a], self.positions[e.b], box)]

    def edge_style(self, e) -> tuple[str, float, str]:
        """(colour, width, label) of an edge now."""
        label = e.path
        if e.measured_gbps:  # what a copy reached, not the link's own rate
            how = "send/recv" if e.kind == "net" else "copy"
            label = f"{e.path} ({how} measured {e.measured_gbps:.3g} GB/s)"
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

    def edge_labels(self) -> list[str]:
        """The text on each edge's marker now ("" on a dense graph: hover them instead)."""
        labels = [self.edge_style(e)[2] for e in self.edges]
        return [""] * len(labels) if len(labels) > 16 and not self.rates else labels

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
            # a light cell keeps dark text: in JupyterLab's dark theme the inherited
            # text colour is light and would vanish on it
            tds = "".join(f"<td style='background:{_cell_color(c)};color:#1a1a1a;"
                          f"text-align:center;padding:2px 6px'>{html.escape(c)}</td>"
                          for c in row)
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


def topology_figure(g: TopologyGraph, title: str | None = None):
    """The explorer's plotly figure (a plain ``go.Figure``): edges first, one trace each,
    then the edge markers, the legend entries, the host boxes' labels and the nodes."""
    import plotly.graph_objects as go

    topology = g.topology
    fig = go.Figure()  # built in full (route included), then a widget: figure_widget
    styles = [g.edge_style(e) for e in g.edges]
    for e, (color, width, _) in zip(g.edges, styles, strict=True):
        (x0, y0), (x1, y1) = g.positions[e.a], g.positions[e.b]
        fig.add_scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip",
                        showlegend=False, line={"color": color, "width": width})
    mids = [g.mid_point(e) for e in g.edges]
    fig.add_scatter(x=[m[0] for m in mids], y=[m[1] for m in mids], mode="markers+text",
                    text=g.edge_labels(), textposition="top center",
                    marker={"size": 9, "color": "rgba(255,255,255,0.9)",
                            "line": {"width": 1, "color": "#666"}},
                    hovertext=[f"{e.a}–{e.b}: {e.path}, click for detail" for e in g.edges],
                    hoverinfo="text", name="links", showlegend=False)
    for kind in sorted({e.kind for e in g.edges}):  # the edge colours' legend
        fig.add_scatter(x=[None], y=[None], mode="lines", name=EDGE_NAME.get(kind, kind),
                        line={"color": EDGE_COLOR.get(kind, "#999999"), "width": 4},
                        hoverinfo="skip")
    for hid, (x0, y0, x1, y1) in g.host_boxes().items():  # a box per host, named on top
        fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, layer="below",
                      line={"color": "#aaaaaa", "dash": "dot"}, fillcolor="rgba(0,0,0,0.03)")
        fig.add_annotation(x=(x0 + x1) / 2, y=y1, text=html.escape(topology.node(hid).label),
                           showarrow=False, yanchor="bottom", font={"size": 13})
    nodes = [n for n in topology.nodes if n.id in g.positions]
    inside = [g.text_position(n) == "middle center" for n in nodes]
    fig.add_scatter(
        x=[g.positions[n.id][0] for n in nodes], y=[g.positions[n.id][1] for n in nodes],
        mode="markers+text", textposition=[g.text_position(n) for n in nodes],
        showlegend=False, text=[g.node_text(n) for n in nodes],
        textfont={"color": ["white" if k else "#888" for k in inside]},
        hovertext=[f"{n.label}<br>{n.kind}<br>source: {n.source}" for n in nodes],
        hoverinfo="text", marker={"size": [g.marker_size(n) for n in nodes], "symbol": "square",
                                  "color": [KIND_COLOR.get(n.kind, "#999") for n in nodes]})
    xs = [p[0] for p in g.positions.values()] or [0.0]
    # rows: room on the right for the last node's label ("middle right")
    xrange = {"range": [min(xs) - 0.6, max(xs) + 1.0]} if g.layered else {}
    if g.kind == "hosts":  # the boxes and every label inside the plot
        boxes = [*g.host_boxes().values(), *g.label_boxes().values()]
        xrange = {"range": [min(b[0] for b in boxes) - 0.2, max(b[2] for b in boxes) + 0.2]}
    fig.update_layout(title=title or topology.name, height=520, margin={"l": 10, "r": 10,
                      "t": 40, "b": 10}, xaxis={"visible": False, **xrange},
                      # rows (switched GPUs) use the width; a circle stays round
                      yaxis={"visible": False} if g.layered else
                      {"visible": False, "scaleanchor": "x"},
                      legend={"x": 1.0, "xanchor": "left", "y": 1, "title": {"text": "links"}},
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
                      font={"color": "#888"})
    return fig


class TopologyExplorer:
    """``TopologyExplorer(topology)``: display it (it is an ipywidgets VBox via ``.widget``
    and displays itself in a notebook)."""

    def __init__(self, topology: Topology, *, title: str | None = None, route: str = ""):
        import ipywidgets as W

        self.model = TopologyGraph(topology)
        g = self.model
        fig = topology_figure(g, title)
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
            self._mid_trace.text = self.model.edge_labels()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)
