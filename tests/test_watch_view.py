"""commlab.watch()'s line and figure show every rank and name the worst one (no world:
the view is a function of the per-rank numbers the ranks exchange)."""

from __future__ import annotations

from commlab.torch_backend.watch import StepStats, Watch, rank_ratios, ratio_figure


def _rows(*ratios: float) -> list[dict]:
    return [{"step_us": 300.0, "comm_us": 100.0 * x, "kernel_us": 50.0,
             "compute_us": 100.0, "bytes": 1024.0} for x in ratios]


def test_the_line_names_the_worst_rank_and_lists_every_rank():
    w = Watch(comm=object(), verbose=False)
    text = w.line(StepStats(4, 1.5, _rows(0.5, 1.5, 0.25)))
    assert "comm/compute  1.50 (worst: rank 1)" in text
    assert "per rank: r0 0.50  r1 1.50  r2 0.25" in text
    assert "(baseline steps)" in text  # no baseline before three steps


def test_the_figure_draws_every_rank_beside_the_worst_rank_line():
    history = [StepStats(i, max(rank_ratios(_rows(0.5, 1.0 + i))), _rows(0.5, 1.0 + i))
               .to_dict() for i in range(4)]
    fig = ratio_figure(history, 1.5, 2.0)
    names = [t.name for t in fig.data]
    assert names == ["rank 0", "rank 1", "comm / compute (worst rank)"]
    assert list(fig.data[1].y) == [1.0, 2.0, 3.0, 4.0]
    assert list(fig.data[2].y) == [1.0, 2.0, 3.0, 4.0]
