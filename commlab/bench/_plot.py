"""Latency and bus-bandwidth curves of benchmark records, with plotly."""

from __future__ import annotations

from commlab.bench._records import Record, bw_unit, fmt_bytes
from commlab.widgets import byte_axis, impl_colors, style_figure

_DASH = {"eager": "solid", "graph": "dot"}
ROW_PX = 340  # per op: room for two readable panels whatever the number of traces


def figure(records, *, peak_gbps: float | None = None, title: str = ""):
    """One row per op: latency (µs, log-log) left, busbw (GB/s; MB/s when every value is
    below 1 GB/s) right; one line per
    (impl, mode), one colour per impl (the same in every commlab figure), the legend
    beside the plots. ``peak_gbps`` draws the link's line rate on the busbw panels."""
    from plotly.subplots import make_subplots

    recs = [r if isinstance(r, Record) else Record(**r) for r in records]
    ops = sorted({r.op for r in recs})
    fig = make_subplots(rows=max(1, len(ops)), cols=2, shared_xaxes=True,
                        vertical_spacing=0.12 if len(ops) > 1 else 0.08,
                        subplot_titles=[t for op in ops for t in
                                        (f"{op}: latency", f"{op}: bus bandwidth")])
    impls = sorted({r.impl for r in recs})
    color = impl_colors(impls)
    unit, k = bw_unit([r.busbw_gbps for r in recs])  # MB/s on the CPU backend
    for row, op in enumerate(ops, start=1):
        for impl in impls:
            for mode in ("eager", "graph"):
                pts = sorted((r for r in recs if r.op == op and r.impl == impl and r.mode == mode),
                             key=lambda r: r.bytes)
                if not pts:
                    continue
                name = f"{impl} ({mode})"
                xs = [r.bytes for r in pts]
                text = [fmt_bytes(r.bytes) for r in pts]
                common = dict(x=xs, mode="lines+markers", name=name, legendgroup=name,
                              line={"color": color[impl], "dash": _DASH[mode]}, text=text)
                fig.add_scatter(y=[r.time_us for r in pts], row=row, col=1,
                                showlegend=row == 1, hovertemplate="%{text}: %{y:.1f} µs",
                                **common)
                fig.add_scatter(y=[r.busbw_gbps * k for r in pts], row=row, col=2,
                                showlegend=False, hovertemplate=f"%{{text}}: %{{y:.3g}} {unit}",
                                **common)
        if peak_gbps:
            fig.add_hline(y=peak_gbps * k, line_dash="dash", line_color="gray", row=row, col=2,
                          annotation_text=f"link peak {peak_gbps * k:g} {unit}")
        fig.update_yaxes(type="log", title_text="latency (µs)", row=row, col=1)
        fig.update_yaxes(title_text=f"busbw ({unit})", row=row, col=2)
    fig.update_xaxes(**byte_axis([r.bytes for r in recs], title="message size"))
    fig.update_layout(height=ROW_PX * max(1, len(ops)) + 60,
                      title={"text": title or "commlab benchmark", "x": 0, "xanchor": "left"},
                      margin={"t": 70, "r": 20})
    style_figure(fig, legend_title="implementation (mode)")
    return fig
