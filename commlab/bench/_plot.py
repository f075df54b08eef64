"""Latency and bus-bandwidth curves of benchmark records, with plotly."""

from __future__ import annotations

from commlab.bench._records import Record, fmt_bytes

_DASH = {"eager": "solid", "graph": "dot"}


def figure(records, *, peak_gbps: float | None = None, title: str = ""):
    """One row per op: latency (µs, log-log) left, busbw (GB/s) right; one line per
    (impl, mode). ``peak_gbps`` draws the link's line rate on the busbw panels."""
    from plotly.subplots import make_subplots

    recs = [r if isinstance(r, Record) else Record(**r) for r in records]
    ops = sorted({r.op for r in recs})
    fig = make_subplots(rows=max(1, len(ops)), cols=2, shared_xaxes=True,
                        subplot_titles=[t for op in ops for t in
                                        (f"{op}: latency", f"{op}: busbw")])
    impls = sorted({r.impl for r in recs})
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
               "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
    color = {impl: palette[i % len(palette)] for i, impl in enumerate(impls)}
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
                fig.add_scatter(y=[r.busbw_gbps for r in pts], row=row, col=2,
                                showlegend=False, hovertemplate="%{text}: %{y:.2f} GB/s",
                                **common)
        if peak_gbps:
            fig.add_hline(y=peak_gbps, line_dash="dash", line_color="gray", row=row, col=2,
                          annotation_text=f"link peak {peak_gbps:g} GB/s")
        fig.update_yaxes(type="log", title_text="µs", row=row, col=1)
        fig.update_yaxes(title_text="GB/s", row=row, col=2)
    fig.update_xaxes(type="log", title_text="bytes")
    fig.update_layout(height=320 * max(1, len(ops)), title=title or "commlab benchmark",
                      legend={"orientation": "h", "y": -0.08})
    return fig
