"""%dist_watch on a world of 2 CPU ranks through a real InteractiveShell: the view
updates while a cell runs and names the rank that sleeps before each all_reduce."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("IPython", reason="the notebook extras are not installed")
pytest.importorskip("plotly", reason="the widget extras are not installed")
from IPython.core.error import UsageError

from tests.engine_helpers import cell, magic, shell

CALLS = 40
LATE_CELL = (
    "import time\n"
    "x = torch.ones(1024)\n"
    f"for _ in range({CALLS}):\n"
    "    if rank == 1:\n"
    "        time.sleep(0.03)\n"
    "    commlab.all_reduce(x, algorithm='one_shot')\n"
    "commlab.synchronize()\n")


@pytest.fixture(scope="module")
def ip():
    ip = shell()
    magic(ip, "dist_start", "-n 2 --backend cpu")
    yield ip
    magic(ip, "dist_watch", "stop")
    magic(ip, "dist_stop")


def test_dist_watch_updates_while_the_cell_runs_and_names_the_late_rank(ip):
    view, _ = magic(ip, "dist_watch", "--interval 0.2 --window 100")
    model = view.model
    seen_mid_cell: list[int] = []
    running = threading.Event()
    running.set()

    def sample():
        while running.is_set():
            seen_mid_cell.append(model.total)
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    cell(ip, LATE_CELL)
    running.clear()
    t.join()
    assert any(0 < n < CALLS for n in seen_mid_cell), seen_mid_cell  # drawn mid-cell
    deadline = time.monotonic() + 10
    while model.total < CALLS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert model.total == CALLS, (model.total, model.note, view.watcher.errors)
    late = model.straggler()
    assert late["rank"] == 1 and late["share"] >= 0.8, late
    assert model.late_ms()[1] > 10 > model.late_ms()[0], model.late_ms()  # slept 30 ms
    r0, r1 = model.ratios()
    assert r0 > r1, (r0, r1)  # rank 0 waits inside the collective, rank 1 sleeps outside
    assert list(model.busbw()) == ["all_reduce/one_shot"]
    text = model.summary()
    assert "arrivals: rank 1 arrived last in" in text and "all_reduce calls" in text, text
    deadline = time.monotonic() + 5
    while "rank 1 arrived last" not in view.header.value and time.monotonic() < deadline:
        time.sleep(0.1)  # the pump redraws within ~0.1 s
    assert "rank 1 arrived last" in view.header.value
    want = {"rank 0", "rank 1", "ms late", "all_reduce/one_shot"}
    deadline = time.monotonic() + 5
    names: set = set()
    while time.monotonic() < deadline:  # the pump redraws every interval: a read can
        data = view.figure.data  # fall between its clear and its adds
        names = {tr.name for tr in data}
        if want <= names:
            break
        time.sleep(0.05)
    assert want <= names, names
    bars = next(tr for tr in data if tr.name == "ms late")
    assert bars.y[1] > bars.y[0]

    _, cap = magic(ip, "dist_watch", "stop")
    assert "dist_watch stopped" in cap.stdout
    assert not view.watcher.running
    out = cell(ip, "print('sum', commlab.all_reduce(torch.ones(2)).tolist())").stdout
    assert "sum [2.0, 2.0]" in out


def test_dist_watch_rejects_a_bad_interval_and_stop_without_a_view_says_so(ip):
    with pytest.raises(UsageError, match="--interval: invalid seconds value"):
        magic(ip, "dist_watch", "--interval -1")
    _, cap = magic(ip, "dist_watch", "stop")
    assert "no view was running" in cap.stdout
