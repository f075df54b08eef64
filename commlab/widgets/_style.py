"""One look for commlab's figures: a colour per implementation kept across figures,
binary byte axes, legends beside the plot, full width, transparent backgrounds (the
notebook's theme shows through)."""

from __future__ import annotations

# responsive: the figure follows the output area's width instead of plotly's 700 px
FIG_CONFIG = {"displaylogo": False, "responsive": True}

# 20 distinct colours (plotly's D3 + Dark24 picks); fixed names first, so "nccl" has the
# same colour in every figure; other implementations take the next free one by name
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22", "#2e91e5", "#e15f99", "#1ca71c", "#fb0d0d",
           "#da16ff", "#b68100", "#750d86", "#eb663b", "#511cfb", "#00a08b"]
FIXED = {"nccl": 0, "commlab:one_shot": 1, "commlab:two_shot": 2, "commlab:ring": 3,
         "torch_symm_mem:one_shot": 4, "torch_symm_mem:two_shot": 5, "commlab:auto": 6}


def impl_colors(impls) -> dict[str, str]:
    """implementation -> colour: the same name gets the same colour in every figure."""
    out, used = {}, set()
    for impl in impls:
        if impl in FIXED:
            out[impl] = PALETTE[FIXED[impl]]
            used.add(FIXED[impl])
    free = [i for i in range(len(PALETTE)) if i not in used and i not in FIXED.values()]
    for k, impl in enumerate(sorted(i for i in impls if i not in out)):
        out[impl] = PALETTE[free[k % len(free)]] if free else PALETTE[k % len(PALETTE)]
    return out


def fmt_binary(n: float) -> str:
    """8 -> '8 B'; 65536 -> '64 KiB'; 3 << 30 -> '3 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:g}"


def byte_axis(values, title: str = "bytes") -> dict:
    """A log x-axis with ticks at powers of two, labelled 1 KiB, 64 KiB, 1 MiB..."""
    vals = [v for v in values if v and v > 0]
    if not vals:
        return {"type": "log", "title": {"text": title}}
    lo, hi = int(min(vals)).bit_length() - 1, max(1, int(max(vals)) - 1).bit_length()
    step = max(1, (hi - lo) // 8 or 1)
    step = next(s for s in (1, 2, 4, 5, 10) if s >= step) if step <= 10 else step
    ticks = [1 << e for e in range(lo, hi + 1) if (e - lo) % step == 0]
    return {"type": "log", "tickvals": ticks, "ticktext": [fmt_binary(t) for t in ticks],
            "title": {"text": title}}


def theme_layout() -> dict:
    """Layout keys that let JupyterLab's light or dark theme show through."""
    return {"paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(127,127,127,0.07)",
            "font": {"color": "#888"}, "autosize": True}


def style_figure(fig, *, legend_title: str = "") -> None:
    """Theme-following backgrounds, soft grids, the legend beside the plots (never over
    a title or an axis)."""
    grid = "rgba(127,127,127,0.25)"
    fig.update_layout(legend={"x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top",
                              "title": {"text": legend_title}}, **theme_layout())
    fig.update_xaxes(gridcolor=grid, zerolinecolor=grid)
    fig.update_yaxes(gridcolor=grid, zerolinecolor=grid)


def figure_widget(fig, **config):
    """``fig``, a go.Figure built in full, as a FigureWidget that fits the output width.

    A FigureWidget opens its comm before it holds its traces, layout and config, which
    then follow as state updates; JupyterLab drops updates that arrive while it still
    loads the widget's 5 MB module and draws an empty plot (seen for the first figures
    of a kernel). This one opens its comm once it holds everything. Drawn before it is
    attached, plotly sizes a plot 700 px wide: one relayout after the first draw
    re-measures it (autosize) in its output area."""
    w = _whole_class()(fig)
    w._config = dict(FIG_CONFIG, **config)
    w.open_whole()
    fitted = [False]

    def refit(change):
        if change["new"] is not None and not fitted[0]:
            fitted[0] = True
            w.layout.meta = "fit"  # any relayout: plotly autosizes into the attached box

    w.observe(refit, names="_js2py_layoutDelta")
    return w


_WHOLE: list[type] = []  # the subclass, made at first use (plotly imports lazily)


def _whole_class():
    if not _WHOLE:
        import plotly.graph_objects as go

        class WholeFigureWidget(go.FigureWidget):
            """A FigureWidget whose comm opens on ``open_whole()``, not in __init__."""

            _whole = False

            def open(self):
                if self._whole:
                    super().open()

            def open_whole(self):
                self._whole = True
                self.open()

        _WHOLE.append(WholeFigureWidget)
    return _WHOLE[0]
