"""commlab.watch()'s line and figure show every rank and name the worst one (no world:
the view is a function of the per-rank numbers the ranks exchange)."""

from __future__ import annotations

import pytest

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


def _rec(entry, end, alg="one_shot"):
    return {"op": "all_reduce", "algorithm": alg, "bytes": 4096, "dtype": "float32",
            "call": 1, "entry": entry, "arrived": [max(entry)] * len(entry), "end": end}


def test_dist_watch_model_counts_waiting_as_comm_and_long_gaps_as_idle():
    from commlab.widgets import DistWatchModel

    m = DistWatchModel(window=10, idle_s=1.0)
    ms = 1_000_000
    # rank 1 enters 3 ms after rank 0 each call; calls 10 ms apart, then a 5 s pause
    recs = [_rec([t * ms, (t + 3) * ms], [(t + 4) * ms, (t + 4) * ms]) for t in (0, 10, 20)]
    recs.append(_rec([5020 * ms, 5023 * ms], [5024 * ms, 5024 * ms], alg="two_shot"))
    assert m.add({"seen": 4, "records": recs}) == 4
    r0, r1 = m.ratios()
    assert r0 == pytest.approx(16 / 12)  # 4 ms in each call, 6 ms between; the pause: idle
    assert r1 == pytest.approx(4 / 18)  # 1 ms in each call (it came late), 9 ms between
    assert m.late_ms() == [0.0, 3.0]
    assert m.straggler()["rank"] == 1 and m.last_share() == [0.0, 1.0]
    assert set(m.busbw()) == {"all_reduce/one_shot", "all_reduce/two_shot"}
    assert "rank 1 arrived last in 100% of all_reduce calls" in m.summary()
    assert m.seen == 4 and len(m.points) == 1
