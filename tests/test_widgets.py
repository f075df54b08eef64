"""Widget data models and the %topology / %linkbench magics, without a browser."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("IPython", reason="the notebook extras are not installed")
from IPython.core.error import UsageError

from commlab import topology as T
from commlab.topology._bench_result import LinkBenchResult
from commlab.widgets import (
    LinkBenchView,
    Pump,
    TimelineModel,
    TopologyExplorer,
    TopologyGraph,
    show_timeline,
)
from commlab.widgets._linkbench import curves, heatmap_data


def _result(w=3):
    """A linkbench result as ranks would report it: reader i from source j at 10(i+1)+j."""
    rows = [{"rank": i, "world_size": w, "backend": "cpu", "device": "test",
             "sizes": [4096, 65536], "methods": ["triton", "memcpy"],
             "gbps": {m: [[(10 * (i + 1) + j) * (s + 1) * (k + 1) for j in range(w)]
                          for s in range(2)] for k, m in enumerate(["triton", "memcpy"])}}
            for i in range(w)]
    return LinkBenchResult.from_rows(list(reversed(rows)))


def test_linkbench_result_assembles_rows_into_reader_by_source_matrices():
    r = _result()
    assert r.matrix("triton", 4096) == [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    assert r.curve(1, 2, "memcpy") == [44, 88]
    # CPU: a shm link's peak is the reader's own local copy bandwidth (diagonal, memcpy)
    assert r.peak[2] == [2 * 2 * 32] * 3
    pct = r.percent_of_peak("memcpy")
    assert pct[2][2] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="measured sizes: 4 KiB, 64 KiB"):
        r.matrix("triton", 1 << 20)


def test_linkbench_result_round_trips_through_json(tmp_path):
    r = _result(2)
    assert LinkBenchResult.load(r.save(tmp_path / "lb.json")) == r


def test_linkbench_view_shows_gbps_and_percent_of_the_local_copy_per_cell_on_cpu():
    r = _result(2)
    d = heatmap_data(r, "memcpy", 65536)
    assert d["z"] == [[40, 44], [80, 84]]
    # on CPU the reference is the reader's own measured copy rate, never called a peak
    assert d["text"][0][1] == "44 GB/s<br>110% of local copy"
    assert len(curves(r, "triton")) == 4
    v = LinkBenchView(r)
    v.method.value, v.size.value = "memcpy", 4096
    assert [list(row) for row in v.heatmap.data[0].z] == [[20, 22], [40, 42]]
    assert len([t for t in v.curve.data if t.name.startswith("local copy")]) == 2
    assert not any("peak" in t.name for t in v.curve.data)


def test_topology_graph_highlights_the_route_and_paints_live_rates():
    g = TopologyGraph(T.sample("4xpcie"))
    drawn = {e.key for e in g.edges}
    assert ("gpu0", "gpu1") in drawn and ("gpu0", "nic0") not in drawn  # NODE: matrix only
    g.set_route("ring")
    styles = {e.key: g.edge_style(e) for e in g.edges}
    assert styles[("gpu1", "gpu2")][0] == "#ff7f0e"  # ring crosses the SYS pair
    assert styles[("gpu0", "gpu2")][0] == "#dddddd"  # not on the ring
    g.set_rates({("gpu0", "gpu1"): 31.508})
    color, width, label = g.edge_style(next(e for e in g.edges if e.key == ("gpu0", "gpu1")))
    assert label == "PIX 31.5 GB/s" and width == pytest.approx(10.0)


def test_clicking_a_link_shows_its_per_link_detail():
    x = TopologyExplorer(T.sample("2xh200-nv18"))
    k = next(i for i, e in enumerate(x.model.edges) if e.key == ("gpu0", "gpu1"))
    x.select_edge(k)
    assert "18 of 18" in x.detail.value and x.detail.value.count("<td>up</td>") == 18
    assert "NV18" in x.matrix.value
    x.route_picker.value = "all_to_all"
    assert x.figure.data[k].line.color == "#ff7f0e"
    # the copy-engine rate is labelled as a measurement, the spec rate as the link's peak
    assert "measured copy GB/s (a benchmark&#x27;s rate, not the link&#x27;s)" in x.detail.value
    assert "link peak GB/s per direction (spec)" in x.detail.value and "82%" in x.detail.value
    assert "DESIGN.md" not in x.model.topology.description + "".join(x.model.topology.sources)


def test_the_topo_matrix_cells_keep_dark_text_on_their_light_backgrounds():
    import re

    x = TopologyExplorer(T.sample("2xh200-nv18"))
    cells = re.findall(r"<td style='([^']*)'>", x.matrix.value)
    coloured = [c for c in cells if "background:" in c]
    assert coloured and all("color:#1a1a1a" in c for c in coloured), coloured


def test_switched_topology_has_an_edge_colour_legend_and_labels_off_the_lines():
    x = TopologyExplorer(T.sample("8xh100-nvswitch"))
    assert {t.name for t in x.figure.data if t.showlegend is not False} == {
        "NVLink", "PCIe", "CPU socket link"}
    nodes = x.figure.data[-1]
    # GPUs hold their label inside (lines leave every side); CPUs above, switches below
    assert set(nodes.textposition) == {"middle center", "top center", "bottom center"}


def test_timeline_puts_tile_spans_in_sub_lanes_under_their_rank():
    spans = [{"name": "gemm", "kind": "compute", "rank": 1, "start_us": 0, "end_us": 9},
             {"name": "t", "kind": "copy", "rank": 0, "start_us": 0, "end_us": 2,
              "lane": "sm 12"},
             {"name": "t", "kind": "wait", "rank": 0, "start_us": 0, "end_us": 2,
              "lane": "sm 2"},
             {"name": "ar", "kind": "comm", "rank": 0, "start_us": 1, "end_us": 5,
              "lane": "stream"}]
    m = TimelineModel(spans)
    assert m.lanes() == ["rank 0", "rank 0 · sm 2", "rank 0 · sm 12", "rank 1"]
    assert set(m.bars()) == {"compute", "copy", "wait", "comm"}
    with pytest.raises(ValueError, match="has no 'rank'"):
        TimelineModel([{"name": "x", "kind": "comm", "start_us": 0, "end_us": 1}])


def test_timeline_warning_follows_the_threshold_the_user_sets():
    spans = [{"name": "gemm", "kind": "compute", "rank": 0, "start_us": 0, "end_us": 10},
             {"name": "ar", "kind": "comm", "rank": 0, "start_us": 10, "end_us": 30}]
    v = show_timeline(spans, threshold=1.0)
    assert "communication-heavy" in v.warning.value
    v.threshold.value = 3.0
    assert v.warning.value == ""
    assert "200%" not in v.metrics.value and "<td>0.020</td>" in v.metrics.value  # 20 µs


def test_timeline_labels_its_times_in_ms_and_fills_the_output_width():
    spans = [{"name": "gemm", "kind": "compute", "rank": 0, "start_us": 0, "end_us": 12_345},
             {"name": "ar", "kind": "comm", "rank": 0, "start_us": 2_000, "end_us": 2_500_000}]
    v = show_timeline(spans)
    assert v.figure.layout.xaxis.title.text == "time (ms)"
    bar = next(d for d in v.figure.data if d.name == "comm")
    assert bar.base == (2.0,) and bar.x == (2498.0,)  # ms
    assert "2.00 → 2,500 ms" in bar.hovertext[0]
    assert "<td>2,498</td>" in v.metrics.value and "comm ms" in v.metrics.value
    assert v.figure.layout.width is None and v.figure.layout.autosize
    assert v.figure._config["responsive"] and v.widget.layout.width == "100%"


def test_a_trace_with_120_lanes_fits_one_screen_and_scrolls_inside_the_figure():
    from commlab.widgets._timeline import MAX_LANES

    spans = [{"name": "tile", "kind": "compute", "rank": r, "lane": f"program {p}",
              "start_us": p, "end_us": p + 10} for r in range(2) for p in range(60)]
    v = show_timeline(spans)
    lay = v.figure.layout
    assert len(v.model.lanes()) == 120
    assert lay.height <= 90 + 34 * MAX_LANES <= 720  # no 4000 px page
    assert tuple(lay.yaxis.range) == (MAX_LANES - 0.5, -0.5)  # the first lanes, top down
    assert "of 120 lanes: drag or scroll" in lay.yaxis.title.text
    assert v.figure._config["scrollZoom"] and lay.dragmode == "pan"
    few = show_timeline(spans[:3]).figure.layout
    assert few.yaxis.range is None and few.yaxis.title.text is None


def test_the_communication_heavy_warning_wraps_instead_of_being_cut():
    spans = [{"name": "mm", "kind": "compute", "rank": 0, "start_us": 0, "end_us": 10},
             {"name": "ar", "kind": "comm", "rank": 0, "start_us": 10, "end_us": 5000}]
    html = show_timeline(spans, threshold=1).warning.value
    assert "communication-heavy" in html
    assert "white-space:normal" in html and "ellipsis" not in html


def test_pump_batches_updates_to_about_ten_per_second():
    p = Pump(max_rate=10)
    seen = []
    t0 = time.monotonic()
    for i in range(300):
        p.submit("view", lambda i=i: seen.append(i))
        time.sleep(0.002)
    elapsed = time.monotonic() - t0
    deadline = time.monotonic() + 2
    while (not seen or seen[-1] != 299) and time.monotonic() < deadline:
        time.sleep(0.02)
    p.stop()
    assert seen[-1] == 299  # the latest update always lands
    assert len(seen) <= elapsed * 10 + 3, (len(seen), elapsed)
    assert threading.active_count() < 50


@pytest.fixture
def ip():
    from commlab.magics import observe
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    observe.register(shell)  # what %load_ext commlab does for these magics
    return shell


def test_topology_magic_shows_samples_files_and_text(ip, tmp_path, capsys):
    x = ip.run_line_magic("topology", "--sample 8xh100-nvswitch --route ring")
    assert isinstance(x, TopologyExplorer) and x.model.route_name == "ring"
    path = tmp_path / "t.json"
    ip.run_line_magic("topology", f"--sample 4xpcie --save {path} --text")
    out = capsys.readouterr().out
    assert "GPU0   X      PIX" in out and f"saved {path}" in out
    y = ip.run_line_magic("topology", f"--load {path}")
    assert y.model.topology.name == "4-GPU PCIe box (no NVLink)"


def test_observe_magics_report_misuse_without_a_traceback(ip, tmp_path):
    with pytest.raises(UsageError, match="choose one of"):
        ip.run_line_magic("topology", "--sample nope")
    with pytest.raises(UsageError, match="record one with"):
        ip.run_line_magic("topology", f"--load {tmp_path}/nothing.json")
    with pytest.raises(UsageError, match="no world is running"):
        ip.run_line_magic("linkbench", "")
    with pytest.raises(UsageError, match="multiple of 16"):
        ip.run_line_magic("linkbench", "--sizes 5 -n 2")
    with pytest.raises(UsageError, match="needs NVIDIA GPUs"):
        ip.run_line_magic("topology", "--sample 2xh200-nv18 --live")


def test_linkbench_magic_shows_a_saved_result(ip, tmp_path):
    path = _result(2).save(tmp_path / "lb.json")
    v = ip.run_line_magic("linkbench", f"--load {path}")
    assert isinstance(v, LinkBenchView) and v.result.world_size == 2


def test_warning_threshold_is_per_backend_and_the_box_is_one_line():
    from commlab.widgets import TimelineModel
    from commlab.widgets._timeline import THRESHOLD

    spans = [dict(name="mm", kind="compute", rank=0, start_us=0, end_us=1000, lane="program 0"),
             dict(name="ar", kind="comm", rank=0, start_us=0, end_us=50_000, lane="program 1")]
    cpu = TimelineModel(spans)  # "program N" lanes: the CPU interpreter, ratio 50 is normal
    assert cpu.threshold == THRESHOLD["cpu"] and cpu.warnings_html() == ""
    gpu = TimelineModel(spans, backend="cuda")
    box = gpu.warnings_html()
    assert gpu.threshold == 1.0 and "<ul>" not in box and "<li>" not in box
    assert "50.0 ms" in box and "50.0x" in box
    # the theme's text colour on a translucent background (dark theme: not white on light)
    assert "var(--jp-ui-font-color1" in box and "rgba(255,152,0,0.18)" in box


def test_show_timeline_displays_once_even_inside_a_block():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.user_ns["_spans"] = [dict(name="ar", kind="comm", rank=0, start_us=0, end_us=5)]
    with capture_output() as cap:
        ip.run_cell("from commlab.widgets import show_timeline\n"
                    "if True:\n    show_timeline(_spans)\n", store_history=True)
    assert len(cap.outputs) == 1  # displayed from inside the if-block
    with capture_output() as cap:
        ip.run_cell("show_timeline(_spans)", store_history=True)
    assert len(cap.outputs) == 1  # the last expression's value is not shown a second time
    assert "TimelineView" not in cap.stdout  # nor its repr in its place


def test_figures_share_colours_per_implementation_and_label_bytes_in_binary_units():
    from commlab.widgets import byte_axis, impl_colors

    a = impl_colors(["nccl", "commlab:two_shot"])
    b = impl_colors(["commlab:two_shot", "nccl", "torch_symm_mem:one_shot", "x", "y"])
    assert a["nccl"] == b["nccl"] and a["commlab:two_shot"] == b["commlab:two_shot"]
    many = impl_colors([f"impl{i}" for i in range(12)])
    assert len(set(many.values())) == 12  # no colour repeats after 10 traces
    ax = byte_axis([4096, 65536])
    assert ax["ticktext"][0] == "4 KiB" and ax["ticktext"][-1] == "64 KiB"


def test_progress_shows_only_after_its_delay_and_follows_the_steps(monkeypatch, capsys):
    from commlab.widgets import Progress, _progress

    monkeypatch.setattr(_progress, "DELAY_S", 0.3)
    with Progress("quick", total=2) as p:
        p.step(1)
    assert "quick" not in capsys.readouterr().err  # quick work shows nothing
    with Progress("slow work", total=3) as p:
        p.step(1, 3, "first part")
        time.sleep(1.2)
    err = capsys.readouterr().err
    assert "slow work: 1/3" in err and "first part" in err
