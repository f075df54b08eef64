"""commlab.widgets.WaitGraphView: the wait-for graph of a WaitTimeoutError or a hang
report, as a plain model (positions, arrows, OR-junctions, the knot) and its figure."""

from __future__ import annotations

import pytest

from commlab.errors import WaitTimeoutError
from commlab.racecheck import wait_graph
from commlab.widgets import WaitGraphModel, WaitGraphView


def node(rank, program=0, could=None, **kw):
    return {"rank": rank, "program": program, "where": "Cell In[2], line 7", "kind": "wait",
            "flag_rank": rank, "flag_offset": 0x1000, "op": ">=", "wants": 1, "holds": 0,
            "could_notify": could, **kw}


def test_an_or_wait_is_one_stem_to_an_or_junction_fanning_out_to_every_candidate():
    m = WaitGraphModel(wait_graph([node(r) for r in range(3)], 3))
    arrows = m.arrows()
    stems = [a for a in arrows if a["junction"]]
    fans = [a for a in arrows if a["head"]]
    assert len(stems) == 3 and len(fans) == 6  # one junction per waiter, two candidates each
    assert not any(a["cycle"] for a in arrows)  # a knot: no cycle is drawn
    assert all(p["knot"] for p in m.markers())
    for s in stems:  # every fan of a waiter starts at its junction
        assert sum((f["x0"], f["y0"]) == (s["x1"], s["y1"]) for f in fans) == 2


def test_a_known_ring_is_drawn_as_a_crimson_cycle_labelled_last_notified():
    g = wait_graph([node(r, last_notified_by=(r - 1) % 3) for r in range(3)], 3)
    m = WaitGraphModel(g)
    arrows = m.arrows()
    assert len(arrows) == 3 and all(a["cycle"] and a["how"] == "last" for a in arrows)
    v = WaitGraphView(g)
    texts = [a.text for a in v.figure.layout.annotations if a.text]
    assert texts.count("last notified") == 3
    assert "Cycle: rank 0 -&gt; rank 2 -&gt; rank 1 -&gt; rank 0" in v.verdict.value


def test_the_view_fills_the_output_width_and_follows_the_theme():
    v = WaitGraphView([node(0, could=[1]), node(1, could=[0]), node(2)], world=4)
    lay = v.figure.layout
    assert lay.width is None and lay.autosize  # the output area's width
    assert lay.paper_bgcolor == "rgba(0,0,0,0)"  # the notebook's theme shows through
    assert 300 <= lay.height <= 640
    assert "var(--jp-content-font-color1" in v.verdict.value
    names = [d.name for d in v.figure.data]
    assert "rank not blocked" in names  # rank 3 may notify rank 2: drawn, open
    assert "No deadlock" not in v.verdict.value  # 0 and 1 wait for each other
    assert "Cycle: rank 0 -&gt; rank 1 -&gt; rank 0" in v.verdict.value


def test_a_source_without_a_graph_says_what_to_pass():
    with pytest.raises(ValueError, match="has no wait-for graph"):
        WaitGraphView(WaitTimeoutError("no graph"))
    with pytest.raises(ValueError, match="pass world=N"):
        WaitGraphView([node(0)])
