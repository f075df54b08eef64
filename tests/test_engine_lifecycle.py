"""A world's life: dead ranks, restarts, stuck ranks, resizing, and nothing left behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("IPython", reason="the notebook extras are not installed")
from IPython.core.error import UsageError

from commlab.engine import HangError, RankDiedError, current_world, stop_world, world_or_none
from tests.engine_helpers import alive, cell, magic, shell, shm_leftovers, world_pids


@pytest.fixture(scope="module")
def ip():
    ip = shell()
    yield ip
    stop_world()


def sums(ip) -> str:
    return cell(ip, "print('sum', commlab.all_reduce(torch.ones(2)).tolist(), world_size)").stdout


def test_no_world_gives_a_clear_error_saying_how_to_start(ip):
    with pytest.raises(Exception, match=r"no world: run %dist_start -n N first"):
        current_world()
    with pytest.raises(UsageError, match="no world"):
        cell(ip, "pass")


def test_dead_rank_is_reported_by_number_and_the_survivor_goes_on(ip):
    magic(ip, "dist_start", "-n 2 --backend cpu")
    with pytest.raises(RankDiedError, match=r"rank 1 \(exit code 3\) died"):
        cell(ip, "import os, time\nif rank == 1:\n    os._exit(3)\ncommlab.barrier()\n")
    # the survivor shrank to a world of one (more in tests/test_engine_elastic.py)
    assert "[rank 0] sum [1.0, 1.0] 1" in sums(ip)
    magic(ip, "dist_start", "-n 2 --backend cpu")
    assert "[ranks 0, 1] sum [2.0, 2.0] 2" in sums(ip)


def test_rank_that_ignores_interrupt_is_restarted_after_a_hang(ip):
    old = {ri.rank: ri.pid for ri in current_world().ranks}
    with pytest.raises(HangError) as ei:
        cell(ip, "import signal, time\nif rank == 1:\n"
                 "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                 "    while True:\n        time.sleep(0.05)\n", "--timeout 2")
    assert "rank 1 did not respond" in ei.value.report and "restarted" in ei.value.report
    new = {ri.rank: ri.pid for ri in current_world().ranks}
    assert new[0] == old[0] and new[1] != old[1] and not alive([old[1]])
    assert "[ranks 0, 1] sum [2.0, 2.0] 2" in sums(ip)


def test_resize_grows_and_shrinks_keeping_survivors_namespaces(ip):
    cell(ip, "kept = 100 + rank")
    magic(ip, "dist_resize", "3")
    assert current_world().size == 3
    assert "[ranks 0-2] sum [3.0, 3.0] 3" in sums(ip)
    out = cell(ip, "print(globals().get('kept'), rank)").stdout
    assert "[rank 0] 100 0" in out and "[rank 1] 101 1" in out and "[rank 2] None 2" in out
    dropped = current_world().ranks[2].pid
    magic(ip, "dist_resize", "1")
    assert "[rank 0] sum [1.0, 1.0] 1" in sums(ip)
    assert not alive([dropped])
    magic(ip, "dist_resize", "2")
    assert "[ranks 0, 1] sum [2.0, 2.0] 2" in sums(ip)


def test_stop_leaves_no_process_and_no_shared_memory(ip):
    if world_or_none() is None:  # run alone: start the world the earlier tests left
        magic(ip, "dist_start", "-n 2 --backend cpu")
    pids = world_pids(current_world())
    assert len(alive(pids)) > 3  # two engines, the controller and its schedulers
    magic(ip, "dist_stop")
    assert alive(pids) == []
    assert shm_leftovers(pids) == []


def test_workers_exit_when_the_notebook_kernel_dies(tmp_path):
    # a "kernel" that starts a world, reports its pids and crashes without cleanup
    script = textwrap.dedent("""
        import os, sys
        from commlab.engine import start_world
        w = start_world(2, backend="cpu")
        print(*w.pids(), flush=True)
        os._exit(1)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) >= 3, out.stderr[-2000:]
    deadline = time.monotonic() + 15
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(pids) == [], "orphaned engines or controller stayed alive"
    assert shm_leftovers(pids) == []


def test_restart_before_any_start_says_how_to_start():
    script = ("from commlab.engine import restart_world\n"
              "try:\n    restart_world()\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert "CommlabUsageError no world was started here: run %dist_start -n N first" in \
        out.stdout, out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_lifecycle_magics_print_one_line_each_in_a_real_kernel():
    # a kernel runs an event loop: ipyparallel's engine logs ("Output for 1:", "engine set
    # stopped ... SIGKILL", a removed engine's traceback) would reach the notebook there
    from tests.kernel_helpers import kernel, lines, run

    with kernel() as kc:
        assert run(kc, "%load_ext commlab")["error"] is None
        first = run(kc, "%dist_start -n 3 --backend cpu")
        assert lines(first["text"]) == [lines(first["text"])[-1]], first
        assert run(kc, "%%distributed\nx = rank")["error"] is None
        hang = run(kc, "%%distributed --timeout 2\nif rank == 0:\n    commlab.barrier()\n")
        assert hang["error"] is not None and hang["error"][0] == "HangError"
        again = run(kc, "%dist_start -n 3 --backend cpu")
        assert len(lines(again["text"])) == 1, again["text"]
        assert "previous world of 3 ranks was stopped" in again["text"]
        assert run(kc, "%%distributed\nx = rank")["error"] is None
        shrink = run(kc, "%dist_resize 2")
        assert len(lines(shrink["text"])) == 1, shrink["text"]
        assert "resized from 3 to 2" in shrink["text"]
        hang = run(kc, "%%distributed --timeout 2\nif rank == 0:\n    commlab.barrier()\n")
        assert hang["error"] is not None
        run(kc, "from commlab.engine import current_world\n"
                "els = [el for es in current_world().cluster.engines.values()\n"
                "       for el in es.launchers.values()]")
        stop = run(kc, "import time\n%dist_stop\ntime.sleep(2)")  # late log lines, if any
        assert lines(stop["text"]) == ["world of 2 ranks stopped"], stop["text"]
        after = run(kc, "print('next')")
        assert lines(after["text"]) == ["next"], after["text"]
        # the ranks of the last world ended by the shutdown request, not by a signal
        codes = run(kc, "print(sorted(el.process.exit_code for el in els[-2:]))")
        assert lines(codes["text"]) == ["[0, 0]"], codes["text"]
