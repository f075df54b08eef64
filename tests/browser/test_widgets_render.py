"""In a real browser (JupyterLab + headless Chromium): the three widgets render, and a
breakpoint on a rank is answered through JupyterLab's own input box.

The test starts JupyterLab on 127.0.0.1 (random port, token auth, its own temp dirs),
opens a notebook that starts a 2-rank CPU world and shows the topology explorer, the
linkbench view and the overlap timeline, runs it from the browser, checks that plotly
drew every plot, that no widget error is on the page, that the timelines fill the output
width, and that figures and the warning box follow JupyterLab's dark theme (pixels and
computed colours), saves screenshots to tests/browser/screenshots/ (dark-*.png after the
switch), and shuts JupyterLab down (by its pid).

Needs Debian's chromium (``apt-get install -y chromium``) at /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from commlab.testing import free_port

nbformat = pytest.importorskip("nbformat", reason="the browser test needs the [test] extras")

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).parent / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DONE = "ALL-CELLS-DONE"
WIDGET_ERRORS = ("Error displaying widget", "Failed to load model class", "Traceback",
                 "model not found", "UsageError")

CELLS = [
    "%load_ext commlab",
    "%topology --sample 8xh100-nvswitch --route ring",
    "%dist_start -n 2 --backend cpu",
    "%topology",
    "%linkbench --sizes 4K,64K --iters 1",
    "%%distributed --trace\nimport torch\na = torch.randn(128, 128)\n"
    "with commlab.trace.span('matmul'):\n    y = a @ a\nz = commlab.all_reduce(y)",
    "from commlab.widgets import show_timeline\n"  # a local one that warns: the box
    "show_timeline([dict(name='mm', kind='compute', rank=0, start_us=0, end_us=1000),\n"
    "               dict(name='ar', kind='comm', rank=0, start_us=1000, end_us=5000)],\n"
    "              threshold=1, title='warning box')",
    "%dist_stop",
    f"print('{DONE}')",
]
EXPECTED_PLOTS = 6  # topology x2, linkbench heatmap + curve, two timelines

# in the page: [r, g, b] of the PNG (base64) at (x, y); negative x, y count from the end
PIXEL_JS = """async ([png, x, y]) => {
  const img = new Image(); img.src = 'data:image/png;base64,' + png; await img.decode();
  const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const px = x < 0 ? img.width + x : x, py = y < 0 ? img.height + y : y;
  return Array.from(g.getImageData(px, py, 1, 1).data.slice(0, 3));
}"""
# the warning box's text and background colours as the browser computed them
BOX_JS = """() => { const b = document.querySelector('.commlab-warning');
  const s = getComputedStyle(b); return [s.color, s.backgroundColor,
  getComputedStyle(b.closest('.jp-OutputArea-output')).backgroundColor]; }"""
# each timeline's width against its output area's
WIDTH_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .filter(p => /timeline|warning box/.test(p.querySelector('.gtitle')?.textContent || ''))
  .map(p => [p.getBoundingClientRect().width,
             p.closest('.jp-OutputArea-output').getBoundingClientRect().width])"""


DEBUG_CELLS = [
    "%load_ext commlab",
    "%dist_start -n 2 --backend cpu",
    "%%distributed\nx = 41\nif rank == 1:\n    breakpoint()\n"
    "print('after the breakpoint on', rank)",
    "%dist_stop",
    f"print('{DONE}')",
]


def _notebook(path: Path, cells=CELLS) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer {url.split('?')[0]} within {timeout} s")


@pytest.fixture
def jupyterlab(tmp_path):
    """(base url, token) of a JupyterLab serving tmp_path/root; stopped by pid after."""
    root = tmp_path / "root"
    root.mkdir()
    env = dict(os.environ)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        d = tmp_path / var.lower()
        d.mkdir()
        env[var] = str(d)
    labconfig = tmp_path / "jupyter_config_dir" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": {
        "@jupyterlab/apputils-extension:announcements": True}}))  # no news pop-up
    settings = tmp_path / "lab_settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # every cell stays in the DOM (JupyterLab 4 detaches off-screen cells by default)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp_path / "lab_settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path / "lab_workspaces")
    env["COMMLAB_BACKEND"] = "cpu"
    port, token = free_port(), secrets.token_hex(16)
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly"]  # nothing fetched from PyPI
        + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/api/status?token={token}", proc, 90)
        yield base, token, root
    finally:
        try:  # graceful: the server shuts its kernels down, the kernel's world follows
            req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=5)
        except OSError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)  # our own child, by pid
            proc.wait(timeout=10)
        log.close()
        print((tmp_path / "jupyterlab.log").read_text()[-3000:])


def _wait_for_text(page, needle: str, timeout: float) -> None:
    """Wait until the notebook shows ``needle``; on timeout save a screenshot and fail
    with what the page shows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(needle in t for t in page.locator(".jp-OutputArea-output").all_inner_texts()):
            return
        page.wait_for_timeout(1000)
    page.screenshot(path=str(SHOTS / "timeout.png"))
    pytest.fail(f"the notebook did not print {needle!r} within {timeout} s (screenshot: "
                f"{SHOTS / 'timeout.png'}); it shows:\n{page.inner_text('.jp-Notebook')[-3000:]}")


@contextlib.contextmanager
def _chromium_page():
    """A page of Debian's headless Chromium driven by Playwright (skips without it)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def _open_and_run_all(page, base: str, token: str, name: str) -> None:
    """Open notebook ``name`` in JupyterLab, wait for its kernel, Run All Cells."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{base}/lab/tree/{name}?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    try:  # JupyterLab may ask which kernel to start: the notebook's own
        page.get_by_role("button", name="Select", exact=True).click(timeout=10_000)
    except PlaywrightTimeout:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=60_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()


def _answer_prompt(page, expect: str, answer: str, timeout_ms: int = 120_000) -> str:
    """Wait for the notebook's own input box (a stdin request), check its prompt, type
    ``answer`` + Enter; returns the prompt text."""
    box = page.locator(".jp-Stdin-input").last
    box.wait_for(state="visible", timeout=timeout_ms)
    prompt = page.locator(".jp-Stdin-prompt").last.inner_text()
    assert expect in prompt, prompt
    box.fill(answer)
    box.press("Enter")
    page.wait_for_timeout(300)
    return prompt


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_breakpoint_on_a_rank_is_answered_through_jupyterlabs_input_box(jupyterlab):
    base, token, root = jupyterlab
    _notebook(root / "debug.ipynb", DEBUG_CELLS)
    with _chromium_page() as page:
        _open_and_run_all(page, base, token, "debug.ipynb")
        _answer_prompt(page, "[rank 1] (Pdb)", "p x + 1")
        page.screenshot(path=str(SHOTS / "debugger-prompt.png"))
        _answer_prompt(page, "[rank 1] (Pdb)", "c")
        _wait_for_text(page, DONE, 120)
        text = page.inner_text(".jp-Notebook")
    assert "42" in text, text[-3000:]  # the (Pdb) command ran on rank 1
    assert "after the breakpoint on" in text and "Traceback" not in text, text[-3000:]


@pytest.mark.browser
@pytest.mark.timeout(420)  # a ceiling: ~300 s when six engineers share the 2 cores
def test_topology_linkbench_and_timeline_render_in_jupyterlab(jupyterlab):
    base, token, root = jupyterlab
    _notebook(root / "observe.ipynb")
    with _chromium_page() as page:
        _open_and_run_all(page, base, token, "observe.ipynb")
        _wait_for_text(page, DONE, 240)
        try:
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                f"{EXPECTED_PLOTS}", timeout=30_000)
        finally:
            page.screenshot(path=str(SHOTS / "notebook-end.png"))
        page.wait_for_timeout(500)  # let the last plot finish its transition
        text = page.inner_text(".jp-Notebook")
        plots = page.locator(".js-plotly-plot")
        n_plots = plots.count()
        for i in range(n_plots):
            plots.nth(i).scroll_into_view_if_needed()
            plots.nth(i).screenshot(path=str(SHOTS / f"plot-{i}.png"))
        page.screenshot(path=str(SHOTS / "notebook.png"))
        widths = page.evaluate(WIDTH_JS)
        light = _corner_pixels(page, plots.nth(n_plots - 1))
        _dark_theme(page)
        page.wait_for_timeout(500)
        plots.nth(n_plots - 1).screenshot(path=str(SHOTS / "dark-timeline.png"))
        plots.nth(0).scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "dark-notebook.png"))
        dark = _corner_pixels(page, plots.nth(n_plots - 1))
        box = page.evaluate(BOX_JS)
    errors = [e for e in WIDGET_ERRORS if e in text]
    assert not errors, f"widget errors on the page: {errors}\n{text[-3000:]}"
    assert n_plots >= EXPECTED_PLOTS
    assert "world of 2 ranks" in text  # the world really started
    assert "TimelineView at 0x" not in text  # show_timeline as a cell's value: shown once
    for needle in ("route", "rank 0", "GB/s", "comm/compute", "time (ms)"):
        assert needle in text, needle
    # the timelines fill their output area (no fixed 700 px)
    assert len(widths) == 2 and all(w >= 0.95 * area for w, area in widths), widths
    # figures follow the theme: their background is the notebook's, light then dark
    assert all(sum(p) / 3 > 200 for p in light), light
    assert all(sum(p) / 3 < 80 for p in dark), dark
    # the warning box stays readable in the dark theme: light text on a dark background
    fg, bg = (_rgb(c) for c in box[:2])
    area = _rgb(box[2]) if _rgb(box[2])[3] > 0 else (17, 17, 17, 1.0)  # --jp-layout-color0
    bg_seen = [a * bg[3] + b * (1 - bg[3]) for a, b in zip(bg[:3], area[:3], strict=True)]
    assert sum(fg[:3]) / 3 > 180 and sum(bg_seen) / 3 < 90, box


def _rgb(css: str) -> tuple[float, float, float, float]:
    """'rgb(1, 2, 3)' or 'rgba(1, 2, 3, 0.5)' -> (1, 2, 3, alpha)."""
    parts = [float(v) for v in css[css.index("(") + 1:-1].split(",")]
    return (parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else 1.0)


def _corner_pixels(page, plot) -> list[list[int]]:
    """The figure's paper at its top-right and bottom-left corners (no title, no trace)."""
    import base64

    png = base64.b64encode(plot.screenshot()).decode()
    return [page.evaluate(PIXEL_JS, [png, x, y]) for x, y in ((-4, 4), (4, -4))]


def _dark_theme(page) -> None:
    """Settings > Theme > JupyterLab Dark, as a user switches it."""
    label = page.locator(".lm-Menu-itemLabel")
    page.get_by_role("menuitem", name="Settings", exact=True).click()
    label.filter(has_text=re.compile(r"^Theme$")).first.hover()
    label.filter(has_text=re.compile(r"^JupyterLab Dark$")).first.click()
    page.wait_for_selector("body[data-jp-theme-light='false']", state="attached",
                           timeout=30_000)


LIFECYCLE_CELLS = [
    "%load_ext commlab",
    "%dist_start -n 3 --backend cpu",
    "%%distributed\nx = rank",
    "%dist_start -n 3 --backend cpu",  # replaces the running world: says so in its one line
    "%dist_resize 2",
    "%dist_stop",
    "%dist_start -n 2 --backend cpu",
    "%%distributed\nx = torch.ones(4 + rank)\ny = commlab.all_gather(x)",  # last: Run All stops
]


def _cell_lines(page, index: int) -> list[str]:
    texts = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(
        ".jp-OutputArea-output").all_inner_texts()
    return [ln for t in texts for ln in t.splitlines() if ln.strip()]


@pytest.mark.browser
@pytest.mark.timeout(400)
def test_lifecycle_magics_print_one_line_and_a_rank_error_a_few(jupyterlab):
    base, token, root = jupyterlab
    _notebook(root / "lifecycle.ipynb", LIFECYCLE_CELLS)
    with _chromium_page() as page:
        _open_and_run_all(page, base, token, "lifecycle.ipynb")
        _wait_for_text(page, "RankMismatchError", 300)
        page.wait_for_timeout(3000)  # late log lines, if any, would arrive now
        lines = {i: _cell_lines(page, i) for i in range(len(LIFECYCLE_CELLS))}
        page.screenshot(path=str(SHOTS / "lifecycle.png"), full_page=True)
    for i in (1, 3, 4, 5, 6):
        assert len(lines[i]) == 1, (LIFECYCLE_CELLS[i], lines[i])
    assert "previous world of 3 ranks was stopped" in lines[3][0]
    assert lines[5] == ["world of 2 ranks stopped"]
    err = lines[len(LIFECYCLE_CELLS) - 1]
    assert len(err) <= 8 and any("pass the same shape" in ln for ln in err), err
    assert not any("_common.py" in ln or "_control.py" in ln for ln in err), err
