"""In JupyterLab + headless Chromium: notebook 07 on 3 ranks draws its wait-for graphs
(OR-waits in a knot, then the cycle racecheck's history names), and issue 31's sequence
reports a run-ahead mismatch in its own cell on every rank while the next cell starts
clean (no stale error, no false hang). Helpers and the JupyterLab fixture (conftest)
come from test_widgets_render."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.test_widgets_render import (
    DONE,
    SHOTS,
    _chromium_page,
    _corner_pixels,
    _dark_theme,
    _open_and_run_all,
    _rgb,
    _wait_for_text,
    nbformat,
)

NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "07-find-the-race.ipynb"
# each wait graph's width against its output area's; the verdict lines' text colour
WIDTH_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .map(p => [p.getBoundingClientRect().width,
             p.closest('.jp-OutputArea-output').getBoundingClientRect().width])"""
VERDICT_JS = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output div'))
  .filter(d => (d.textContent || '').startsWith('Wait-for graph.'))
  .map(d => getComputedStyle(d).color)"""
SEQUENCE = [  # (source, raises): the new user's cells from issue 31
    ("%%distributed\nprint(commlab.all_reduce(torch.full((4,), float(rank))).tolist())", False),
    ("%%distributed\nif rank == 2:\n    1/0", True),
    ("%%distributed\ncommlab.all_reduce(torch.ones(4 + (rank == 1)))", True),
    ("%%distributed\nprint('next', commlab.all_reduce(torch.ones(2)).tolist())", False),
]


def _notebook(path: Path) -> tuple[int, int]:
    """Notebook 07 without its %dist_stop, then the sequence; returns the index of the
    sequence's first cell and its execution count under Run All."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if "".join(c.source).strip() != "%dist_stop"]
    first = len(cells)
    count = 1 + sum(c.cell_type == "code" for c in cells)
    for src, raises in SEQUENCE:
        c = nbformat.v4.new_code_cell(src)
        if raises:  # JupyterLab's Run All goes on past a cell tagged so (as nbval does)
            c.metadata["tags"] = ["raises-exception"]
        cells.append(c)
    cells += [nbformat.v4.new_code_cell("%dist_stop"),
              nbformat.v4.new_code_cell(f"print('{DONE}')")]
    nb.cells = cells
    nbformat.write(nb, path)
    return first, count


def _outputs(page, index: int) -> str:
    return "\n".join(page.locator(".jp-Notebook .jp-Cell").nth(index).locator(
        ".jp-OutputArea-output").all_inner_texts())


@pytest.mark.browser
@pytest.mark.timeout(420)
def test_notebook_07_on_3_ranks_and_a_run_ahead_mismatch_stay_in_their_cells(jupyterlab):
    base, token, root = jupyterlab
    first, count = _notebook(root / "outcomes.ipynb")
    with _chromium_page() as page:
        _open_and_run_all(page, base, token, "outcomes.ipynb")
        _wait_for_text(page, DONE, 330)
        page.wait_for_function(  # the two wait-for graphs drawn by plotly
            "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2",
            timeout=30_000)
        page.wait_for_timeout(500)
        text = page.inner_text(".jp-Notebook")
        seq = [_outputs(page, first + i) for i in range(len(SEQUENCE))]
        graphs = page.locator(".js-plotly-plot")
        for i in range(graphs.count()):
            graphs.nth(i).scroll_into_view_if_needed()
            graphs.nth(i).screenshot(path=str(SHOTS / f"wait-graph-{i}.png"))
        page.screenshot(path=str(SHOTS / "outcomes.png"), full_page=True)
        widths = page.evaluate(WIDTH_JS)
        _dark_theme(page)
        page.wait_for_timeout(500)
        graphs.nth(0).scroll_into_view_if_needed()
        graphs.nth(0).screenshot(path=str(SHOTS / "dark-wait-graph.png"))
        dark = _corner_pixels(page, graphs.nth(0))
        verdict = page.evaluate(VERDICT_JS)
    for bad in ("Error displaying widget", "Failed to load model class", "model not found"):
        assert bad not in text, bad
    # notebook 07: 3 ranks, the knot of OR-waits, then the ring named from the history
    assert "world of 3 ranks started" in text
    assert "any of ranks 1, 2 could notify it (an OR-wait)" in text
    assert "Deadlock: ranks 0, 1, 2 are blocked" in text
    assert "last notified by rank 2" in text
    assert "Cycle: rank 0 -> rank 2 -> rank 1 -> rank 0" in text
    assert "Wait-for graph." in text  # the widget's verdict line
    # the graphs fill their output area, and stay readable in the dark theme: the
    # figure's background is the notebook's, the verdict's text light
    assert len(widths) >= 2 and all(w >= 0.95 * area for w, area in widths), widths
    assert all(sum(p) / 3 < 80 for p in dark), dark
    assert verdict and all(sum(_rgb(c)[:3]) / 3 > 150 for c in verdict), verdict
    # issue 31's sequence: each cell's outcome in that cell
    assert "[3.0, 3.0, 3.0, 3.0]" in seq[0], seq[0]
    assert "ZeroDivisionError on rank 2" in seq[1], seq[1]
    assert "RankMismatchError on ranks 0-2 (of 3)" in seq[2], seq[2]
    assert f"Cell In[{count + 2}], line 2" in seq[2], seq[2]  # its cell, JupyterLab's line
    assert "----> 2 commlab.all_reduce(torch.ones(4 + (rank == 1)))" in seq[2], seq[2]
    assert "next [3.0, 3.0]" in seq[3] and "Error" not in seq[3], seq[3]
    assert "Hang" not in seq[3] and "stayed blocked" not in seq[3], seq[3]
