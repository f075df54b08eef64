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
from commlab.trace.overlap import fmt_time
from commlab.widgets._style import figure_widget, style_figure

# comm/compute above which the box warns, per backend: on GPUs communication outweighing
# compute is worth a look; on the CPU backend Triton's interpreter runs communication
# kernels 2-220x slower than torch's matmul (measured on notebooks 03 and 05), so only a
# ratio beyond that range says something about the program
THRESHOLD = {"cuda": 1.0, "cpu": 250.0}

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


def fmt_ms(us: float) -> str:
    """A time in µs as milliseconds, thousands separated: 20 -> '0.020', 12345 -> '12.35',
    2.5e6 -> '2,500'."""
    ms = us / 1e3
    if abs(ms) >= 100:
        return f"{ms:,.0f}"
    if abs(ms) >= 1:
        return f"{ms:,.2f}"
    return f"{ms:.3f}"


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def default_threshold(spans, backend: str | None = None) -> float:
    """``THRESHOLD`` of ``backend``; without one, of the backend the spans come from
    ("program N" lanes: the CPU interpreter; "sm N": a GPU), else of this process."""
    if backend is None:
        lanes = {str(s.get("lane", "")).split(" ")[0] for s in spans}
        if "sm" in lanes:
            backend = "cuda"
        elif "program" in lanes:
            backend = "cpu"
        else:
            import sys

            torch = sys.modules.get("torch")
            backend = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    return THRESHOLD.get(backend, 1.0)


class TimelineModel:
    def __init__(self, spans=(), threshold: float | None = None, backend: str | None = None):
        self.spans: list[dict] = []
        self.add(spans)
        self.threshold = (default_threshold(self.spans, backend) if threshold is None
                          else threshold)

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
        return sorted(keys, key=keys.__getitem__)

    def bars(self) -> dict[str, dict]:
        """Per kind: lists y (lane), base (start ms), x (duration ms), hover text."""
        out: dict[str, dict] = {}
        for s in sorted(self.spans, key=lambda s: s["start_us"]):
            b = out.setdefault(s["kind"], {"y": [], "base": [], "x": [], "text": []})
            dur = max(s["end_us"] - s["start_us"], 1e-3)
            b["y"].append(self.lane_of(s))
            b["base"].append(s["start_us"] / 1e3)
            b["x"].append(dur / 1e3)
            extra = "".join(f"<br>{k}: {s[k]}" for k in ("bytes", "algorithm") if s.get(k))
            b["text"].append(f"{html.escape(s['name'])} ({s['kind']})<br>"
                             f"{fmt_ms(s['start_us'])} → {fmt_ms(s['end_us'])} ms "
                             f"({fmt_time(dur)}){extra}")
        return out

    def metrics(self):
        return overlap_metrics(self.spans)

    def warnings(self) -> list[str]:
        return ratio_warnings(self.metrics(), self.threshold)

    def metrics_html(self) -> str:
        def f(v, fmt):
            return "—" if v is None else fmt(v)

        def pct(v):
            return f"{100 * v:.0f}%"

        def ratio(v):
            return f"{v:,.1f}"

        rows = "".join(
            f"<tr><td>{r}</td><td>{f(m.comm_us, fmt_ms)}</td><td>{f(m.compute_us, fmt_ms)}</td>"
            f"<td>{f(m.overlap_ratio, pct)}</td><td>{f(m.exposed_comm_us, fmt_ms)}</td>"
            f"<td>{f(m.comm_compute_ratio, ratio)}</td></tr>" for r, m in self.metrics().items())
        return ("<table class='commlab-overlap'><tr><th>rank</th><th>comm ms</th>"
                "<th>compute ms</th><th>overlap |comm∩comp|/|comm|</th><th>exposed comm ms</th>"
                f"<th>comm/compute</th></tr>{rows}</table>")

    def warnings_html(self) -> str:
        w = self.warnings()
        if not w:
            return ""
        items = html.escape("; ".join(w))
        # the theme's text colour on a translucent orange: readable in JupyterLab's light
        # and dark themes alike (its --jp-warn-color3 is light orange in both)
        return ("<div class='commlab-warning' style='background:rgba(255,152,0,0.18);"
                "color:var(--jp-ui-font-color1,#222);border-left:4px solid "
                "var(--jp-warn-color1,#e0a800);padding:2px 8px;white-space:normal;"
                "overflow-wrap:anywhere' "
                f"title='{items}'>⚠ communication-heavy (comm/compute > "
                f"{self.threshold:,g}): {items}</div>")

    def chrome_trace(self, path=None) -> dict:
        return to_chrome_trace(self.spans, path)


MAX_LANES = 18  # lanes drawn at once: 18 x 34 px + margins fit a laptop screen


class TimelineView:
    """The timeline widget; ``add_spans`` updates it live (batched through the pump)."""

    def __init__(self, spans=(), *, threshold: float | None = None,
                 title: str = "overlap timeline", backend: str | None = None):
        import ipywidgets as W
        import plotly.graph_objects as go

        self.model = TimelineModel(spans, threshold, backend)
        self._shown_at: int | None = None  # the cell that displayed it (show_timeline)
        self.figure = go.Figure()  # built in full, then a widget (see figure_widget)
        self.figure.update_layout(
            title={"text": title, "x": 0.01, "xanchor": "left"}, barmode="overlay",
            dragmode="pan", height=300, margin={"l": 140, "r": 120, "t": 40, "b": 40},
            xaxis={"title": {"text": "time (ms)"},
                   "rangeslider": {"visible": True, "thickness": 0.06}},
            yaxis={"autorange": "reversed", "type": "category"})
        style_figure(self.figure, legend_title="span kind")
        self.threshold = W.BoundedFloatText(value=self.model.threshold, min=0.0, max=1e6,
                                            step=0.1,
                                            description="warn if comm/compute >",
                                            style={"description_width": "initial"})
        self.threshold.observe(self._on_threshold, names="value")
        self.metrics = W.HTML()
        self.warning = W.HTML()
        self._draw()
        self.figure = figure_widget(self.figure, scrollZoom=True)
        # the output area's full width: the figure autosizes into its box (no width set)
        self.widget = W.VBox([self.warning, self.figure, W.HBox([self.threshold]), self.metrics],
                             layout=W.Layout(width="100%"))

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
            shown = min(len(lanes), MAX_LANES)
            self.figure.layout.height = max(260, 90 + 34 * shown)
            # more lanes than fit a screen: show the first MAX_LANES, the rest a drag or a
            # scroll of the wheel away inside the figure (the page does not grow)
            self.figure.layout.yaxis.range = ([shown - 0.5, -0.5] if len(lanes) > shown
                                              else None)
            self.figure.layout.yaxis.title = ({"text": f"{shown} of {len(lanes)} lanes: "
                                                       f"drag or scroll"}
                                              if len(lanes) > shown else None)
        self.metrics.value = self.model.metrics_html()
        self.warning.value = self.model.warnings_html()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def _ipython_display_(self) -> None:
        """As a cell's value: the widget, unless show_timeline displayed it in this cell
        already (no second copy, and no ``<TimelineView at 0x...>`` text instead)."""
        if _shown_in_this_cell(self):
            return
        from IPython.display import display

        display(self.widget)


def _shown_in_this_cell(view) -> bool:
    ip = _shell()
    return ip is not None and getattr(view, "_shown_at", None) == ip.execution_count


def _shell():
    import sys

    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def show_timeline(spans, *, threshold: float | None = None, title: str = "overlap timeline",
                  backend: str | None = None) -> TimelineView:
    """Display a timeline widget of ``spans`` (Span objects, or dicts: Span.to_dict() plus
    "rank") and return it, e.g. to ``add_spans`` later. It displays from anywhere in a
    cell (inside an ``if``, a loop) and once only when it is also the cell's last value.
    ``threshold``: warn above this comm/compute ratio (default per backend: THRESHOLD)."""
    view = TimelineView(spans, threshold=threshold, title=title, backend=backend)
    ip = _shell()
    if ip is not None:
        from IPython.display import display

        display(view.widget)
        view._shown_at = ip.execution_count
    return view
