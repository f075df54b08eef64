"""Overlap timeline: one lane per rank, sub-lanes for tile spans ("sm 12", "program 3"),
zoom and pan, overlap metrics per rank and a warning when communication outweighs
compute by more than a threshold you set.

``TimelineModel`` is the data model (lanes, bars, metrics, warnings), plain Python;
``TimelineView`` the widget; ``show_timeline(spans)`` what ``%%distributed --trace`` calls.
"""

from __future__ import annotations

import html
import re

from commlab.trace import Span, overlap_metrics, ratio_warnings, to_chrome_trace

KIND_COLOR = {"comm": "#e45756", "compute": "#4c78a8", "copy": "#f58518", "wait": "#bab0ac",
              "reduce": "#54a24b", "memcpy": "#b279a2"}
_MAIN = re.compile(r"^(|stream.*|thread.*)$")


def _as_dict(s) -> dict:
    if isinstance(s, Span):
        return s.to_dict()
    if isinstance(s, dict):
        if "rank" not in s:
            raise ValueError(f"show_timeline: span {s.get('name')!r} has no 'rank'; pass "
                             f"Span objects or Span.to_dict() plus 'rank'")
        return s
    raise TypeError(f"show_timeline: expected Span or dict, got {type(s).__name__}")


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


class TimelineModel:
    def __init__(self, spans=(), threshold: float = 1.0):
        self.spans: list[dict] = []
        self.threshold = threshold
        self.add(spans)

    def add(self, spans) -> None:
        self.spans.extend(_as_dict(s) for s in spans)

    def lane_of(self, s: dict) -> str:
        lane = s.get("lane") or ""
        if _MAIN.match(lane):
            return f"rank {s['rank']}"
        return f"rank {s['rank']} · {lane}"

    def lanes(self) -> list[str]:
        """Lane labels top to bottom: each rank's main lane, then its sub-lanes."""
        keys = {}
        for s in self.spans:
            lane = self.lane_of(s)
            sub = "" if lane == f"rank {s['rank']}" else lane
            keys[lane] = (int(s["rank"]), sub != "", _natural(sub))
        return sorted(keys, key=keys.get)

    def bars(self) -> dict[str, dict]:
        """Per kind: lists y (lane), base (start µs), x (duration µs), hover text."""
        out: dict[str, dict] = {}
        for s in sorted(self.spans, key=lambda s: s["start_us"]):
            b = out.setdefault(s["kind"], {"y": [], "base": [], "x": [], "text": []})
            dur = max(s["end_us"] - s["start_us"], 1e-3)
            b["y"].append(self.lane_of(s))
            b["base"].append(s["start_us"])
            b["x"].append(dur)
            extra = "".join(f"<br>{k}: {s[k]}" for k in ("bytes", "algorithm") if s.get(k))
            b["text"].append(f"{html.escape(s['name'])} ({s['kind']})<br>"
                             f"{s['start_us']:.1f} → {s['end_us']:.1f} µs ({dur:.1f} µs){extra}")
        return out

    def metrics(self):
        return overlap_metrics(self.spans)

    def warnings(self) -> list[str]:
        return ratio_warnings(self.metrics(), self.threshold)

    def metrics_html(self) -> str:
        def f(v, pct=False):
            if v is None:
                return "—"
            return f"{100 * v:.0f}%" if pct else f"{v:.1f}"

        rows = "".join(
            f"<tr><td>{r}</td><td>{f(m.comm_us)}</td><td>{f(m.compute_us)}</td>"
            f"<td>{f(m.overlap_ratio, True)}</td><td>{f(m.exposed_comm_us)}</td>"
            f"<td>{f(m.comm_compute_ratio)}</td></tr>" for r, m in self.metrics().items())
        return ("<table class='commlab-overlap'><tr><th>rank</th><th>comm µs</th>"
                "<th>compute µs</th><th>overlap |comm∩comp|/|comm|</th><th>exposed comm µs</th>"
                f"<th>comm/compute</th></tr>{rows}</table>")

    def warnings_html(self) -> str:
        w = self.warnings()
        if not w:
            return ""
        items = "".join(f"<li>{html.escape(x)}</li>" for x in w)
        return ("<div class='commlab-warning' style='background:#fff3cd;border:1px solid "
                f"#e0a800;padding:4px 8px'>⚠ communication-heavy<ul>{items}</ul></div>")

    def chrome_trace(self, path=None) -> dict:
        return to_chrome_trace(self.spans, path)


class TimelineView:
    """The timeline widget; ``add_spans`` updates it live (batched through the pump)."""

    def __init__(self, spans=(), *, threshold: float = 1.0, title: str = "overlap timeline"):
        import ipywidgets as W
        import plotly.graph_objects as go

        self.model = TimelineModel(spans, threshold)
        self.figure = go.FigureWidget()
        # Config first: a figure whose traces exist before its config is assigned renders
        # blank in JupyterLab (plotly 7 FigureWidget, seen in the browser test).
        self.figure._config = {"scrollZoom": True, "displaylogo": False}
        self.figure.update_layout(
            title=title, barmode="overlay", dragmode="pan", height=300,
            margin={"l": 140, "r": 10, "t": 40, "b": 40},
            xaxis={"title": "µs", "rangeslider": {"visible": True, "thickness": 0.06}},
            yaxis={"autorange": "reversed", "type": "category"},
            legend={"orientation": "h", "y": 1.12})
        self.threshold = W.BoundedFloatText(value=threshold, min=0.0, max=1e6, step=0.1,
                                            description="warn if comm/compute >",
                                            style={"description_width": "initial"})
        self.threshold.observe(self._on_threshold, names="value")
        self.metrics = W.HTML()
        self.warning = W.HTML()
        self.widget = W.VBox([self.warning, self.figure, W.HBox([self.threshold]), self.metrics])
        self._draw()

    def add_spans(self, spans) -> None:
        from commlab.widgets._pump import PUMP

        self.model.add(spans)
        PUMP.submit((id(self), "spans"), self._draw)

    def _on_threshold(self, change) -> None:
        self.model.threshold = float(change["new"])
        self.warning.value = self.model.warnings_html()

    def _draw(self) -> None:
        bars = self.model.bars()
        lanes = self.model.lanes()
        with self.figure.batch_update():
            self.figure.data = []
            for kind, b in bars.items():
                self.figure.add_bar(orientation="h", y=b["y"], base=b["base"], x=b["x"],
                                    name=kind, hovertext=b["text"], hoverinfo="text",
                                    marker={"color": KIND_COLOR.get(kind, "#999999"),
                                            "line": {"width": 0}}, opacity=0.85)
            self.figure.layout.yaxis.categoryarray = lanes
            self.figure.layout.yaxis.categoryorder = "array"
            self.figure.layout.height = max(260, 90 + 34 * len(lanes))
        self.metrics.value = self.model.metrics_html()
        self.warning.value = self.model.warnings_html()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)


def show_timeline(spans, *, threshold: float = 1.0, title: str = "overlap timeline"):
    """A timeline widget of ``spans`` (Span objects, or dicts: Span.to_dict() plus "rank")."""
    return TimelineView(spans, threshold=threshold, title=title)
