"""The live view of ``%dist_watch``: what the kernels' call records say while cells run.

``DistWatchModel`` (plain Python, fed ``CallRecord.to_dict()`` dicts) keeps the last
``window`` calls and computes, per rank, the comm/compute ratio (time inside commlab's
collectives, waiting included, against the time between them; gaps over ``idle_s``
count as the notebook idling, not compute), how late each rank enters on average and
who came last (``trace.arrivals.straggler``), and the bus bandwidth of every call by
algorithm. ``DistWatchView`` draws it: a header naming the late rank and three plots
(ratio per rank over time, mean lateness per rank, GB/s per algorithm), redrawn through
the widget pump as records arrive.
"""

from __future__ import annotations

import html
import statistics
import time
from collections import deque

from commlab.runtime.records import CallRecord
from commlab.trace.arrivals import straggler, straggler_text


def _call(d: dict) -> CallRecord:
    return CallRecord(d["op"], d["algorithm"], int(d["bytes"]), d.get("dtype", ""),
                      int(d["call"]), list(d["entry"]), list(d["arrived"]), list(d["end"]))


def _merged_ns(iv: list[tuple[int, int]], idle_ns: float) -> tuple[float, float]:
    """(time covered by the intervals, time between them short of ``idle_ns``)."""
    busy = gaps = 0.0
    spans: list[list[int]] = []
    for s, e in sorted(iv):
        if spans and s <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], e)
        else:
            spans.append([s, e])
    for i, (s, e) in enumerate(spans):
        busy += e - s
        if i:
            gap = s - spans[i - 1][1]
            gaps += gap if gap < idle_ns else 0.0
    return busy, gaps


class DistWatchModel:
    def __init__(self, window: int = 200, idle_s: float = 1.0, keep_points: int = 300):
        if window < 2:
            raise ValueError(f"window must be at least 2 calls, got {window}")
        self.window, self.idle_ns = window, idle_s * 1e9
        self.calls: deque[CallRecord] = deque(maxlen=window)
        self.seen = 0  # records taken so far (rank 0's count: the next pull's cursor)
        self.total = 0  # calls added
        self.points: deque[dict] = deque(maxlen=keep_points)  # {"t", "ratios"} per add
        self.bw: dict[str, deque] = {}  # "op/algorithm" -> (call number, GB/s)
        self.note = ""  # why nothing shows (records off, no world), from the last pull
        self.t0 = time.monotonic()

    def add(self, reply: dict) -> int:
        """Take a rank's reply (``World.call_records``); returns how many calls were new."""
        self.note = str(reply.get("off") or reply.get("error") or "")
        recs = [_call(d) for d in reply.get("records") or []]
        self.seen = max(self.seen, int(reply.get("seen", self.seen)))
        for r in recs:
            self.total += 1
            self.calls.append(r)
            self.bw.setdefault(f"{r.op}/{r.algorithm}", deque(maxlen=self.window * 2)) \
                .append((self.total, r.busbw_gbps))
        if recs:
            self.points.append({"t": time.monotonic() - self.t0, "ratios": self.ratios()})
        return len(recs)

    # -- what the window says --------------------------------------------------------------
    @property
    def world(self) -> int:
        return max((r.world for r in self.calls), default=0)

    def ratios(self) -> list[float]:
        """comm / compute per rank over the window."""
        out = []
        for rank in range(self.world):
            iv = [(r.entry[rank], max(r.end[rank], r.entry[rank])) for r in self.calls
                  if rank < r.world]
            comm, compute = _merged_ns(iv, self.idle_ns)
            out.append(comm / compute if compute > 0 else float("inf") if comm else 0.0)
        return out

    def late_ms(self) -> list[float]:
        """Per rank: how much later than the first rank it entered, on average (ms)."""
        w = self.world
        if not self.calls or w < 2:
            return []
        return [statistics.fmean(r.entry[k] - min(r.entry) for r in self.calls
                                 if k < r.world) / 1e6 for k in range(w)]

    def last_share(self) -> list[float]:
        """Per rank: the share of the window's calls it entered last."""
        recs = [r for r in self.calls if r.world > 1]
        return [sum(r.last_rank == k for r in recs) / len(recs) if recs else 0.0
                for k in range(self.world)]

    def straggler(self) -> dict | None:
        return straggler(list(self.calls))

    def busbw(self) -> dict[str, float]:
        """Median bus bandwidth (GB/s) per "op/algorithm" in the window."""
        per: dict[str, list[float]] = {}
        for r in self.calls:
            per.setdefault(f"{r.op}/{r.algorithm}", []).append(r.busbw_gbps)
        return {k: statistics.median(v) for k, v in sorted(per.items())}

    def summary(self) -> str:
        """The view's header as text: the late rank, the ratios, the bandwidths."""
        if not self.calls:
            return "dist_watch: no call records yet" + (f" ({self.note})" if self.note else "")
        lines = [f"dist_watch: last {len(self.calls)} calls of {self.total} ({self.world} "
                 f"ranks)", "arrivals: " + straggler_text(list(self.calls))]
        lines.append("comm/compute: " + "  ".join(f"r{k} {x:.2f}"
                                                  for k, x in enumerate(self.ratios())))
        lines.append("late vs first (ms): " + "  ".join(
            f"r{k} {x:.3g}" for k, x in enumerate(self.late_ms())))
        lines.append("bus bandwidth (median): " + "  ".join(
            f"{k} {v:.3g} GB/s" for k, v in self.busbw().items()))
        return "\n".join(lines)


class DistWatchView:
    """The widget: a header and three plots, redrawn at most ~10 times a second."""

    def __init__(self, model: DistWatchModel | None = None):
        import ipywidgets as W
        from plotly.subplots import make_subplots

        from commlab.widgets._style import figure_widget, style_figure

        self.model = model or DistWatchModel()
        fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(
            "comm / compute per rank", "ms late vs the first rank", "bus bandwidth (GB/s)"))
        fig.update_layout(height=320, margin={"l": 50, "r": 20, "t": 50, "b": 40})
        fig.update_xaxes(title_text="s since %dist_watch", row=1, col=1)
        fig.update_xaxes(title_text="rank", row=1, col=2)
        fig.update_xaxes(title_text="call", row=1, col=3)
        style_figure(fig)
        self.figure = fig
        self.header = W.HTML()
        self.draws = 0
        self._draw()
        self.figure = figure_widget(fig)
        self.widget = W.VBox([self.header, self.figure], layout=W.Layout(width="100%"))

    def update(self) -> None:
        from commlab.widgets._pump import PUMP

        PUMP.submit((id(self), "draw"), self._draw)

    def _draw(self) -> None:
        m, fig = self.model, self.figure
        ts = [p["t"] for p in m.points]
        late, share = m.late_ms(), m.last_share()
        with fig.batch_update():
            fig.data = []
            for k in range(m.world):
                fig.add_scatter(x=ts, y=[p["ratios"][k] if k < len(p["ratios"]) else None
                                         for p in m.points], mode="lines+markers",
                                name=f"rank {k}", legendgroup="ratio", row=1, col=1)
            fig.add_bar(x=[f"r{k}" for k in range(len(late))], y=late, name="ms late",
                        text=[f"last in {s:.0%}" for s in share], showlegend=False,
                        row=1, col=2)
            for key, pts in m.bw.items():
                fig.add_scatter(x=[c for c, _ in pts], y=[g for _, g in pts], mode="markers",
                                name=key, legendgroup="bw", row=1, col=3)
        late_rank = m.straggler()
        head = html.escape(m.summary()).replace("\n", "<br>")
        if late_rank is not None and late_rank["share"] >= 0.5:
            head = head.replace("arrivals:", "<b style='color:#e45756'>arrivals:</b>", 1)
        self.header.value = f"<div style='font-family:monospace'>{head}</div>"
        self.draws += 1

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)
