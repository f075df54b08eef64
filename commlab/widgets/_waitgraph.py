"""The wait-for graph of a ``WaitTimeoutError`` or a hang report, drawn.

``WaitGraphModel`` is plain data (tested without a browser): one node per blocked
program, placed around its rank's point on a circle; one arrow per known notifier
(labelled "last notified" where racecheck's history chose it); an OR-wait (any of several ranks
may notify) as one short stem from the waiter to a small "or" junction that fans out to
each candidate; the knot (deadlocked programs) outlined in crimson and a known cycle's
arrows thick crimson. ``WaitGraphView`` shows the verdict as text above a figure that
fills the output area's width (its height grows with the ranks), with transparent
backgrounds and mid-grey text, readable in JupyterLab's light and dark themes.
"""

from __future__ import annotations

import html
import math
from typing import Any

from commlab.widgets._style import figure_widget, theme_layout

CRIMSON, GREY = "#dc143c", "#8a8a8a"
MARKER = 72  # px: "program 12" fits inside


def graph_of(source, world: int | None = None) -> dict[str, Any]:
    """The graph dict (``commlab.racecheck.wait_graph``) of ``source``: a
    WaitTimeoutError or HangError (its ``wait_graph``), such a dict, or a list of
    nodes with ``world``."""
    g = getattr(source, "wait_graph", source)
    if isinstance(g, list):
        from commlab.racecheck import wait_graph

        if world is None:
            raise ValueError("WaitGraphView(nodes): pass world=N with a list of nodes")
        g = wait_graph(g, world)
    if not isinstance(g, dict) or "nodes" not in g:
        raise ValueError(f"WaitGraphView: {type(source).__name__} has no wait-for graph "
                         f"(no kernel was blocked in cl.wait/cl.barrier); pass a "
                         f"WaitTimeoutError, a HangError with one, or wait_graph(...)'s dict")
    return g


class WaitGraphModel:
    """Positions, arrows and labels of a wait-for graph (see the module docstring)."""

    def __init__(self, graph: dict[str, Any]):
        self.graph = graph
        nodes = graph["nodes"]
        ranks = sorted({n["rank"] for n in nodes} | {r for n in nodes for r in n["notifiers"]})
        self.ranks = ranks
        k = max(len(ranks), 1)
        # ranks clockwise from the top; a rank's programs on a small arc around its point
        self.rank_xy = {r: (math.sin(2 * math.pi * i / k), math.cos(2 * math.pi * i / k))
                        for i, r in enumerate(ranks)}
        by_rank: dict[int, list[int]] = {}
        for i, n in enumerate(nodes):
            by_rank.setdefault(n["rank"], []).append(i)
        self.xy: dict[int, tuple[float, float]] = {}
        for r, idx in by_rank.items():
            cx, cy = self.rank_xy[r]
            for j, i in enumerate(idx):
                a = 2 * math.pi * j / len(idx)
                d = 0.0 if len(idx) == 1 else 0.28
                self.xy[i] = (cx * 1.0 + d * math.sin(a), cy * 1.0 + d * math.cos(a))
        self.knot = set(graph.get("knot", []))
        self.cycle_edges = set(zip(graph.get("cycle", []), graph.get("cycle", [])[1:],
                                   strict=False))

    def markers(self) -> list[dict]:
        """One per blocked program: position, label, hover (its sentence), in the knot."""
        out = []
        for i, n in enumerate(self.graph["nodes"]):
            x, y = self.xy[i]
            out.append({"x": x, "y": y, "label": f"rank {n['rank']}<br>program {n['program']}",
                        "hover": self.graph["lines"][i], "knot": i in self.knot})
        return out

    def idle_ranks(self) -> list[dict]:
        """Ranks that could notify but have no blocked program: drawn as open circles."""
        blocked = {n["rank"] for n in self.graph["nodes"]}
        return [{"x": self.rank_xy[r][0], "y": self.rank_xy[r][1], "label": f"rank {r}"}
                for r in self.ranks if r not in blocked]

    def arrows(self) -> list[dict]:
        """Segments (x0, y0) -> (x1, y1): ``how`` (of the waiter), ``cycle``, ``head`` (an
        arrowhead at the end), ``from_node``/``to_node`` (the ends sit on a marker);
        an OR-wait's stem ends at its "or" junction, whose fan starts there."""
        g, out = self.graph, []
        for i, n in enumerate(g["nodes"]):
            x0, y0, from_node = *self.xy[i], True
            targets = [self._target(i, r) for r in n["notifiers"]]
            if n["how"] == "any" and len(targets) > 1:
                # the stem to an "or" junction a third of the way toward the candidates
                mx = sum(t[0] for t in targets) / len(targets)
                my = sum(t[1] for t in targets) / len(targets)
                jx, jy = x0 + (mx - x0) / 3, y0 + (my - y0) / 3
                out.append({"x0": x0, "y0": y0, "x1": jx, "y1": jy, "how": "any",
                            "cycle": False, "head": False, "from_node": True,
                            "to_node": False, "junction": True})
                x0, y0, from_node = jx, jy, False
            for tx, ty, j in targets:
                out.append({"x0": x0, "y0": y0, "x1": tx, "y1": ty, "how": n["how"],
                            "cycle": (i, j) in self.cycle_edges, "head": True,
                            "from_node": from_node, "to_node": True, "junction": False})
        return out

    def _target(self, i: int, rank: int) -> tuple[float, float, int | None]:
        """Where an arrow from node ``i`` to ``rank`` ends: the blocked program of that
        rank it may be satisfied by (a barrier: the same program), else the rank's
        point (a rank not blocked)."""
        for j, m in enumerate(self.graph["nodes"]):
            if m["rank"] == rank and [i, j] in self.graph["edges"]:
                return (*self.xy[j], j)
        return (*self.rank_xy[rank], None)

    def height(self) -> int:
        """Pixels: room for the circle and the labels, more for more ranks."""
        return int(min(640, 300 + 40 * len(self.ranks)))


class WaitGraphView:
    """``WaitGraphView(err)``: the verdict and the drawn graph of a WaitTimeoutError, a
    HangError, ``wait_graph(...)``'s dict, or a list of nodes with ``world=N``."""

    def __init__(self, source, world: int | None = None):
        import ipywidgets as W
        import plotly.graph_objects as go

        self.model = WaitGraphModel(graph_of(source, world))
        m = self.model
        fig = go.Figure()
        arrows = m.arrows()
        for a in arrows:
            fig.add_annotation(x=a["x1"], y=a["y1"], ax=a["x0"], ay=a["y0"], xref="x",
                               yref="y", axref="x", ayref="y", text="", showarrow=True,
                               arrowhead=3 if a["head"] else 0,
                               arrowwidth=3 if a["cycle"] else 1.5,
                               arrowcolor=CRIMSON if a["cycle"] else GREY,
                               standoff=MARKER // 2 + 2 if a["to_node"] else 0,
                               startstandoff=MARKER // 2 + 2 if a["from_node"] else 0)
            if a["how"] == "last" and a["head"]:
                fig.add_annotation(x=(a["x0"] + a["x1"]) / 2, y=(a["y0"] + a["y1"]) / 2,
                                   text="last notified", showarrow=False, yshift=9,
                                   font={"size": 10, "color": GREY})
        junctions = [a for a in arrows if a["junction"]]
        if junctions:
            fig.add_scatter(x=[a["x1"] for a in junctions], y=[a["y1"] for a in junctions],
                            mode="markers+text", text=["or"] * len(junctions),
                            textposition="middle right", hoverinfo="skip",
                            name="OR-wait: any one of the fanned ranks could notify",
                            marker={"size": 9, "color": GREY})
        idle = m.idle_ranks()
        if idle:
            fig.add_scatter(x=[r["x"] for r in idle], y=[r["y"] for r in idle],
                            mode="markers+text", text=[r["label"] for r in idle],
                            name="rank not blocked", hoverinfo="skip",
                            marker={"size": MARKER, "color": "rgba(0,0,0,0)",
                                    "line": {"color": GREY, "width": 1}})
        mk = m.markers()
        fig.add_scatter(x=[p["x"] for p in mk], y=[p["y"] for p in mk], mode="markers+text",
                        text=[p["label"] for p in mk], hovertext=[p["hover"] for p in mk],
                        hoverinfo="text", name="blocked program (crimson: deadlocked)",
                        marker={"size": MARKER, "color": [
                            "rgba(220,20,60,0.22)" if p["knot"] else "rgba(127,127,127,0.18)"
                            for p in mk], "line": {"width": 2, "color": [
                                CRIMSON if p["knot"] else GREY for p in mk]}})
        fig.update_layout(**theme_layout(), height=m.height(), showlegend=True,
                          legend={"orientation": "h", "y": -0.02, "yanchor": "top"},
                          margin={"t": 10, "l": 10, "r": 10, "b": 10},
                          xaxis={"visible": False, "range": [-1.6, 1.6]},
                          yaxis={"visible": False, "range": [-1.5, 1.5], "scaleanchor": "x"})
        self.figure = figure_widget(fig)
        g = m.graph
        color = "var(--jp-content-font-color1, inherit)"
        self.verdict = W.HTML(
            f"<div style='color:{color};white-space:normal'><b>Wait-for graph.</b> "
            f"{html.escape(g['text'])}<br><small>An arrow runs from a blocked program to a "
            f"rank that can notify it; at an \"or\" any one of the fanned ranks could (an "
            f"OR-wait). Crimson: deadlocked (the knot); thick crimson: a known cycle. "
            f"Hover a program for its kernel line, flag and values.</small></div>")
        self.widget = W.VBox([self.verdict, self.figure],
                             layout=W.Layout(width="100%"))

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)


def show_wait_graph(source, world: int | None = None) -> WaitGraphView:
    """Display ``WaitGraphView(source)`` and return it."""
    from IPython.display import display

    view = WaitGraphView(source, world)
    display(view.widget)
    return view
