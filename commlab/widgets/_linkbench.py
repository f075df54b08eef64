"""Linkbench view: a heatmap of GB/s for every ordered pair (reader row, source column)
with % of the link's peak (on the CPU backend: of the reader's local copy) in each cell,
and the bandwidth-vs-size curve of each pair. In a world across hosts the pairs on
different hosts (send/recv over the network, often 10-100x slower) get their own colour
scale, so neither kind of link washes the other out, and dash-dot curves."""

from __future__ import annotations

import html

from commlab.topology._bench_result import LinkBenchResult, fmt_bytes
from commlab.widgets._style import byte_axis, figure_widget, style_figure


def heatmap_data(res: LinkBenchResult, method: str, size: int | None = None) -> dict:
    """z (GB/s), cell text and axis labels for the heatmap: plain data for tests. Across
    hosts also ``z_local``/``z_cross`` (the other kind of cell None), each with its scale."""
    mat = res.matrix(method, size)
    pct = res.percent_of_peak(method, size)
    ref = reference_name(res)
    cross = res.cross_host
    text = [[f"{v:.3g} GB/s<br>{p:.3g}% of {ref}" if p is not None else f"{v:.3g} GB/s"
             for v, p in zip(row, prow, strict=True)] for row, prow in zip(mat, pct, strict=True)]
    for i, row in enumerate(text):
        for j in range(len(row)):
            if cross[i][j]:
                row[j] = f"{mat[i][j]:.3g} GB/s<br>between hosts (send/recv)"
    host_of = {r: h for h, ranks in enumerate(res.hosts) for r in ranks}
    ranks = [f"rank {i}" + (f" · host {host_of[i]}" if res.hosts else "")
             for i in range(res.world_size)]
    local = [[None if c else v for v, c in zip(row, crow, strict=True)]
             for row, crow in zip(mat, cross, strict=True)]
    far = [[v if c else None for v, c in zip(row, crow, strict=True)]
           for row, crow in zip(mat, cross, strict=True)]
    # the colour scale starts at 0: a 12% spread between pairs must look like one
    top = max([v for row in local for v in row if v] + [p for row in (res.peak or [])
                                                         for p in row if p] + [1e-9])
    top_cross = max([v for row in far for v in row if v] + [1e-9])
    return {"z": mat, "text": text, "x": ranks, "y": ranks, "pct": pct, "zmin": 0.0,
            "zmax": top, "cross": cross, "z_local": local, "z_cross": far,
            "zmax_cross": top_cross}


def reference_name(res: LinkBenchResult) -> str:
    """What the percentages compare with: the link's peak from a topology, or (CPU
    backend, no topology) the reader's own local copy rate, a measurement, not a peak."""
    return "local copy" if "local copy" in res.peak_source else "link peak"


def curves(res: LinkBenchResult, method: str) -> list[dict]:
    """One line per ordered pair: {"name", "x" (bytes), "y" (GB/s), "local"}."""
    out, cross = [], res.cross_host
    for i in range(res.world_size):
        for j in range(res.world_size):
            name = f"{i}←{j}" if i != j else f"{i} local"
            out.append({"name": name + (" (between hosts)" if cross[i][j] else ""),
                        "x": list(res.sizes), "y": res.curve(i, j, method), "local": i == j,
                        "cross_host": cross[i][j]})
    return out


class LinkBenchView:
    """``LinkBenchView(result)``: heatmap + size curves, with method and size pickers."""

    def __init__(self, result: LinkBenchResult):
        import ipywidgets as W
        import plotly.graph_objects as go

        self.result = result
        self.method = W.Dropdown(options=result.methods, value=result.methods[0],
                                 description="method")
        self.size = W.Dropdown(options=[(fmt_bytes(s), s) for s in result.sizes],
                               value=result.sizes[-1], description="size")
        self.heatmap = go.Figure()  # built in full, then widgets: see figure_widget
        hover = "%{y} reads %{x}: %{text}<extra></extra>"
        self.heatmap.add_heatmap(z=[[0]], colorscale="Viridis", colorbar={"title": "GB/s"},
                                 texttemplate="%{text}", hovertemplate=hover)
        if result.hosts:  # pairs between hosts: their own scale, beside the first
            self.heatmap.add_heatmap(z=[[0]], colorscale="Oranges", texttemplate="%{text}",
                                     hovertemplate=hover, colorbar={
                                         "title": "GB/s between<br>hosts", "x": 1.12})
        self.heatmap.update_layout(height=400, margin={"t": 40, "l": 80, "r": 10,
                                   "b": 40}, yaxis={"autorange": "reversed", "title": "reader"},
                                   xaxis={"title": "source"})
        self.curve = go.Figure()
        self.curve.update_layout(height=420, margin={"t": 40, "l": 60, "r": 10,
                                 "b": 40}, xaxis=byte_axis(result.sizes, "message size"),
                                 yaxis={"title": "bandwidth (GB/s)", "type": "log"})
        # full output width, one above the other: the legend (long pair and peak names)
        # beside the curve has room and is never clipped
        style_figure(self.curve, legend_title="reader←source")
        style_figure(self.heatmap)
        peak_src = html.escape(result.peak_source)
        self.note = W.HTML(f"<small>{html.escape(result.device)} · {result.backend} · "
                           f"GB/s = bytes / median time · % of {reference_name(result)}: "
                           f"{peak_src}</small>")
        self._draw()
        self.heatmap, self.curve = figure_widget(self.heatmap), figure_widget(self.curve)
        self.method.observe(lambda ch: self._draw(), names="value")
        self.size.observe(lambda ch: self._draw(), names="value")
        self.widget = W.VBox([W.HBox([self.method, self.size]),
                              self.heatmap, self.curve, self.note])

    def update(self, result: LinkBenchResult) -> None:
        """Show a new result (batched through the pump)."""
        from commlab.widgets._pump import PUMP

        self.result = result
        PUMP.submit((id(self), "result"), self._draw)

    def _draw(self) -> None:
        res, m = self.result, self.method.value
        d = heatmap_data(res, m, self.size.value)
        with self.heatmap.batch_update():
            h = self.heatmap.data[0]
            h.z, h.text, h.x, h.y = d["z_local"], d["text"], d["x"], d["y"]
            h.zmin, h.zmax = d["zmin"], d["zmax"]
            if len(self.heatmap.data) > 1:
                c = self.heatmap.data[1]
                c.z, c.text, c.x, c.y = d["z_cross"], d["text"], d["x"], d["y"]
                c.zmin, c.zmax = 0.0, d["zmax_cross"]
            self.heatmap.layout.title = f"{m}: GB/s at {fmt_bytes(self.size.value)}"
        with self.curve.batch_update():
            self.curve.data = []
            for c in curves(res, m):
                dash = "dot" if c["local"] else "dashdot" if c["cross_host"] else "solid"
                self.curve.add_scatter(x=c["x"], y=c["y"], name=c["name"], mode="lines+markers",
                                       line={"dash": dash})
            peaks = {p for row in res.peak for p in row if p}
            for p in sorted(peaks)[:3]:
                readers = [i for i, row in enumerate(res.peak) if p in row]
                whose = (f"reader {readers[0]}" if len(readers) == 1 else
                         f"readers {', '.join(map(str, readers))}")
                ref = reference_name(res)
                self.curve.add_scatter(x=[res.sizes[0], res.sizes[-1]], y=[p, p], mode="lines",
                                       name=f"{ref} {p:,.1f} GB/s ({whose})",
                                       hovertemplate=f"{ref}: {html.escape(res.peak_source)}"
                                       "<extra></extra>",
                                       line={"dash": "dash", "color": "#888"})
            self.curve.layout.title = f"{m}: bandwidth vs size"

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)
