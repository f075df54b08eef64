"""%%distributed on a world of 2 CPU ranks, driven through a real InteractiveShell.

One world for the module (starting one costs seconds); every test leaves it usable, and
several check exactly that by running a collective afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

pytest.importorskip("IPython", reason="the notebook extras are not installed")
from IPython.core.error import UsageError

from commlab.engine import DistributedError, HangError, current_world
from tests.engine_helpers import cell, magic, shell

ALL_REDUCE_CHECK = "print('sum', commlab.all_reduce(torch.ones(3) * (rank + 1)).tolist())"


@pytest.fixture(scope="module")
def ip():
    ip = shell()
    magic(ip, "dist_start", "-n 2 --backend cpu")
    yield ip
    magic(ip, "dist_stop")


def assert_world_works(ip):
    out = cell(ip, ALL_REDUCE_CHECK).stdout
    grouped = "[ranks 0, 1] sum [3.0, 3.0, 3.0]" in out
    apart = all(f"[rank {r}] sum [3.0, 3.0, 3.0]" in out for r in (0, 1))  # a loaded machine
    assert grouped or apart, out


def test_identical_lines_are_printed_once_with_their_ranks(ip):
    out = cell(ip, "print('same line')\nprint(f'rank is {rank}')\nrank * 10").stdout
    assert "[ranks 0, 1] same line" in out
    assert "[rank 0] rank is 0" in out and "[rank 1] rank is 1" in out
    assert "[rank 0] Out: 0" in out and "[rank 1] Out: 10" in out
    assert out.count("same line") == 1


def test_stderr_rich_displays_and_tqdm_bars_come_through(ip):
    cap = cell(ip, "import sys\nfrom IPython.display import display, HTML\n"
                   "from tqdm import tqdm\n"
                   "print('warned', file=sys.stderr)\n"
                   "display(HTML(f'<b>rank {rank}</b>'))\n"
                   "for _ in tqdm(range(5), file=sys.stderr, desc='bar'):\n"
                   "    pass\n")
    assert "[ranks 0, 1] warned" in cap.stderr
    assert "bar: 100%" in cap.stderr
    html = sorted(o.data.get("text/html", "") for o in cap.outputs)
    assert html == ["<b>rank 0</b>", "<b>rank 1</b>"]


def test_triton_kernel_defined_in_a_cell_compiles_and_runs_on_every_rank(ip):
    out = cell(ip, "@triton.jit\n"
                   "def add_rank(x_ptr, r, N: tl.constexpr):\n"
                   "    offs = tl.arange(0, N)\n"
                   "    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + r)\n"
                   "x = torch.zeros(4)\n"
                   "add_rank[(1,)](x, rank, 4)\n"
                   "print(x.tolist())\n").stdout
    assert "[rank 0] [0.0, 0.0, 0.0, 0.0]" in out and "[rank 1] [1.0, 1.0, 1.0, 1.0]" in out


RACY_CELL = (
    "import commlab.language as cl\n"
    "@triton.jit\n"
    "def racy(buf, ctx, N: tl.constexpr):\n"
    "    offs = tl.arange(0, N)\n"
    "    tl.store(cl.symm_at(buf + offs, 1, ctx), offs.to(tl.float32))\n"  # both ranks write
    "buf = commlab.symmetric_zeros((16,))\n"                              # rank 1's buf
    "commlab.barrier()\n"
    "racy[(1,)](buf, commlab.get_communicator().context, 16)\n")


def test_racecheck_flag_runs_the_cell_under_racecheck_on_every_rank(ip):
    cell(ip, RACY_CELL)  # unchecked: runs
    with pytest.raises(DistributedError, match="DataRaceError") as ei:
        cell(ip, RACY_CELL, "--racecheck")
    assert "stored to it" in "\n".join(ei.value._render_traceback_())
    with pytest.raises(DistributedError, match="DataRaceError") as ei:
        cell(ip, RACY_CELL, "--racecheck --shuffle --seed 5")
    assert "shuffle seed 5" in "\n".join(ei.value._render_traceback_())
    for bad, says in (("--seed 5", "add --racecheck"), ("--shuffle", "add --racecheck"),
                      ("--racecheck --seed 5", "add --shuffle")):
        with pytest.raises(UsageError, match=says):
            cell(ip, RACY_CELL, bad)
    assert_world_works(ip)


def test_failing_cell_raises_one_error_grouping_identical_tracebacks(ip):
    with pytest.raises(DistributedError) as ei:
        cell(ip, "a = 1\nb = 0\nif rank >= 0:\n    a / b\n")
    e = ei.value
    assert str(e).startswith("ZeroDivisionError on ranks 0, 1")
    text = "\n".join(e._render_traceback_())
    assert "line 5" in text and text.count("ZeroDivisionError on") == 1  # JupyterLab's line
    with pytest.raises(DistributedError, match=r"^KeyError on rank 1"):
        cell(ip, "if rank == 1:\n    {}['missing']\n")


def test_collective_called_on_one_rank_is_reported_within_timeout_and_world_recovers(ip):
    t0 = time.monotonic()
    with pytest.raises(HangError) as ei:
        cell(ip, "x = torch.ones(4)\nif rank == 0:\n    commlab.all_reduce(x)\n",
             "--timeout 3")
    elapsed = time.monotonic() - t0
    report = ei.value.report
    assert "--timeout 3 s passed" in report
    assert "[rank 0] blocked in commlab.all_reduce" in report
    assert "agreement block" in report
    assert re.search(r"Cell In\[\d+\], line 4, in <module>:  commlab.all_reduce\(x\)", report)
    assert "rank 1 had finished the cell" in report
    assert "the world recovered" in report
    assert elapsed < 3 + 15, elapsed
    assert_world_works(ip)


WAIT_CELL = (
    "import commlab.language as cl\n"
    "@triton.jit\n"
    "def stuck(flag, ctx):\n"
    "    p = tl.program_id(0)\n"
    "    if p == 0 or cl.rank(ctx) == 0:\n"
    "        cl.wait(flag + p, 1)\n"                                      # line 6
    "        cl.notify(flag + p, (cl.rank(ctx) + 1) % cl.num_ranks(ctx), ctx, 1)\n"
    "flag = commlab.symmetric_zeros((4,), torch.int32)\n"
    "commlab.barrier()\n"
    "stuck[(2,)](flag, comm.context)\n")


def test_hang_report_shows_the_wait_for_graph_of_kernels_blocked_in_cl_wait(ip):
    # program 0 of both ranks waits for the other's notify (a cycle); rank 0's program 1
    # waits on flag[1], which nobody sets
    with pytest.raises(HangError) as ei:
        cell(ip, WAIT_CELL, "--timeout 3")
    report = ei.value.report
    assert "Wait-for graph" in report, report
    for r in (0, 1):
        assert (f"rank {r} program 0 at " in report and
                f"waits on rank {r}'s flag at heap offset" in report), report
    assert "(flag[0]) for 1 and holds 0" in report
    assert "rank 0 program 1 at " in report and "(flag[1]) for 1 and holds 0" in report
    assert "rank 1 program 1" not in report
    line = next(ln for ln in report.splitlines() if "rank 0 program 1 at" in ln)
    # the cell's cl.wait line, numbered as JupyterLab shows it (%%distributed is line 1)
    assert re.search(r"at Cell In\[\d+\], line 7 waits", line), line
    assert "Cycle: rank 0 -> rank 1 -> rank 0" in report
    g = ei.value.wait_graph  # the same graph, for commlab.widgets.show_wait_graph
    assert g["cycle_ranks"] == [0, 1, 0] and len(g["nodes"]) == 3
    from commlab.widgets import WaitGraphView

    assert "Cycle: rank 0 -&gt; rank 1" in WaitGraphView(ei.value).verdict.value
    assert_world_works(ip)


def test_hang_report_shows_the_stack_of_a_rank_that_ignores_the_dump_signal(ip):
    # stacks come from the rank's agent thread through the world hub, not from a signal:
    # a rank that ignores SIGUSR1 (as CUDA-world ranks on 2xH200 seemed to) still reports
    with pytest.raises(HangError) as ei:
        cell(ip, "import signal, time\nif rank == 0:\n"
                 "    signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n    time.sleep(60)\n",
             "--timeout 2")
    assert re.search(r"Cell In\[\d+\], line 5, in <module>:  time.sleep\(60\)",
                     ei.value.report), ei.value.report
    assert_world_works(ip)


def test_hang_is_detected_from_per_rank_completion_without_timeout(ip):
    # rank 1 finishes at once, rank 0 waits in a barrier nobody else calls
    t0 = time.monotonic()
    with pytest.raises(HangError, match=r"rank 1 finished but rank 0 stayed blocked"):
        cell(ip, "if rank == 0:\n    commlab.barrier()\n", "--grace 1")
    assert time.monotonic() - t0 < 15
    assert_world_works(ip)


def test_slow_rank_that_is_computing_is_not_reported_as_hung(ip):
    # rank 0 computes (not in a collective) for longer than the grace period
    cap = cell(ip, "import time\nif rank == 0:\n    time.sleep(3.5)\nprint('finished')\n",
               "--grace 0.5")
    out = cap.stdout
    assert "[ranks 0, 1] finished" in out or ("[rank 0] finished" in out
                                              and "[rank 1] finished" in out)
    # the wait said what it waits for after ~2 s (a progress line, gone at the end)
    assert "rank 1 finished; waiting for rank 0" in cap.stderr, cap.stderr


def test_a_live_line_counts_toward_the_timeout_while_every_rank_runs(ip):
    cap = cell(ip, "import time\ntime.sleep(3)\nprint('slept')\n", "--timeout 20")
    assert "slept" in cap.stdout
    assert "ranks 0, 1 running; stacks reported at the --timeout (of 20 s)" in cap.stderr, \
        cap.stderr


KINETO_CELL = """import os, tempfile
saved, err = os.dup(2), tempfile.TemporaryFile()
os.dup2(err.fileno(), 2)  # kineto writes to fd 2, which a notebook shows in the cell
try:
    with torch.profiler.profile():
        torch.ones(3) + 1
finally:
    os.dup2(saved, 2)
err.seek(0)
print("kineto lines:", err.read().decode().count("profiler_st"))
"""


def test_the_torch_profiler_on_ranks_prints_no_kineto_lines(ip):
    out = cell(ip, KINETO_CELL).stdout
    assert "kineto lines: 0" in out and "kineto lines: 2" not in out, out


def test_commbench_steps_its_progress_per_op_and_size(ip, monkeypatch):
    import commlab.widgets as widgets

    steps = []

    class Recording(widgets.Progress):
        def step(self, done, total=None, what=""):
            steps.append((done, what))
            super().step(done, total, what)

    monkeypatch.setattr(widgets, "Progress", Recording)
    magic(ip, "commbench", "--sizes 8,64 --iters 1 --algorithms gloo")
    assert steps == [(0, "all_reduce 8 B"), (1, "all_reduce 64 B"), (2, "done")]
    assert len(ip.user_ns["_commbench"]) == 2  # one record per size, merged


def test_ctrl_c_reaches_every_rank_and_the_world_stays_usable(ip):
    # Ctrl-C raises KeyboardInterrupt here, as in a notebook kernel during a cell
    # (ipykernel installs this handler while a cell runs); a test run started in the
    # background by a shell without job control inherits SIGINT ignored instead
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as ei:
            cell(ip, "import time\nfor _ in range(600):\n    time.sleep(0.1)\n")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    assert time.monotonic() - t0 < 15
    assert "ranks 0, 1" in str(ei.value) and "recovered" in str(ei.value)
    assert_world_works(ip)


def _script(monkeypatch, answers: dict[int, list[str]]):
    import commlab.engine._wait as wait

    prompts = []

    def ask(prompt):
        prompts.append(prompt)
        rank = int(prompt.split("]")[0].split()[-1])
        return answers[rank].pop(0)

    monkeypatch.setattr(wait, "ask", ask)
    return prompts


def test_breakpoint_on_a_rank_opens_a_prompt_labelled_by_rank(ip, monkeypatch):
    prompts = _script(monkeypatch, {1: ["p secret * 2", "c"]})
    out = cell(ip, "secret = 21 + rank\nif rank == 1:\n    breakpoint()\nprint('after', secret)"
               ).stdout
    assert prompts == ["[rank 1] (Pdb) ", "[rank 1] (Pdb) "]
    assert "[rank 1] 44" in out
    assert "[rank 0] after 21" in out and "[rank 1] after 22" in out
    # Pdb stops at the cell's next line (IPython runs each statement as its own code
    # object), not at the breakpoint() line's --Return--, as notebook 01 shows
    assert "[rank 1] -> print('after', secret)" in out and "--Return--" not in out


def test_the_other_ranks_output_shows_while_one_rank_waits_in_pdb(ip, monkeypatch):
    import sys

    import commlab.engine._wait as wait

    seen = []

    def ask(prompt):  # answers once rank 0's late line is on the notebook's stdout
        deadline = time.monotonic() + 20
        while "[rank 0] late" not in sys.stdout.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        seen.append("[rank 0] late" in sys.stdout.getvalue())
        return "c"

    monkeypatch.setattr(wait, "ask", ask)
    cell(ip, "import time\nif rank == 1:\n    breakpoint()\nelse:\n    time.sleep(1.5)\n"
             "    print('late', flush=True)\n")
    assert seen == [True]  # shown while the prompt waited, not held until 'c'


def test_breakpoint_inside_a_triton_kernel_on_the_cpu_backend(ip, monkeypatch):
    prompts = _script(monkeypatch, {0: ["p int(scale)", "c"], 1: ["p int(scale)", "c"]})
    out = cell(ip, "@triton.jit\n"
                   "def scaled(x_ptr, scale, N: tl.constexpr):\n"
                   "    offs = tl.arange(0, N)\n"
                   "    breakpoint()\n"
                   "    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * scale)\n"
                   "x = torch.ones(2)\n"
                   "scaled[(1,)](x, rank + 3, 2)\n"
                   "print(x.tolist())\n").stdout
    assert sorted(prompts) == ["[rank 0] (Pdb) "] * 2 + ["[rank 1] (Pdb) "] * 2
    assert "[rank 0] 3" in out and "[rank 1] 4" in out
    assert "[rank 0] [3.0, 3.0]" in out and "[rank 1] [4.0, 4.0]" in out


def test_quitting_the_debugger_ends_the_cell_on_every_rank(ip, monkeypatch):
    _script(monkeypatch, {0: ["q"]})
    t0 = time.monotonic()
    cap = cell(ip, "if rank == 0:\n    breakpoint()\n    print('not reached')\n"
                   "commlab.barrier()\nprint('not reached either')\n")
    assert "] not reached" not in cap.stdout  # neither print ran (Pdb lists the line)
    assert "debugger quit" in cap.stdout
    assert time.monotonic() - t0 < 15
    assert_world_works(ip)


def test_push_and_pull_move_values_between_notebook_and_ranks(ip):
    ip.user_ns["lr"] = 0.5
    magic(ip, "dist_push", "lr")
    cell(ip, "scaled_lr = lr * (rank + 1)")
    assert magic(ip, "dist_pull", "scaled_lr")[0] == [0.5, 1.0]
    assert magic(ip, "dist_pull", "scaled_lr --rank 1")[0] == 1.0
    with pytest.raises(UsageError, match="nope not defined"):
        magic(ip, "dist_push", "nope")


def test_apply_returns_results_in_rank_order_and_groups_errors(ip):
    w = current_world()
    assert (w.size, w.backend) == (2, "cpu")

    def who(offset):
        import commlab

        return commlab.get_communicator().rank + offset

    assert w.apply(who, 10) == [10, 11]
    with pytest.raises(DistributedError, match=r"^ValueError on ranks 0, 1"):
        w.apply(lambda: int("x"))


def test_trace_collects_spans_from_every_rank(ip):
    cap = cell(ip, "y = commlab.all_reduce(torch.ones(8))\n", "--trace")
    try:
        import commlab.widgets as widgets

        has_widget = hasattr(widgets, "show_timeline")
    except ImportError:
        has_widget = False
    if has_widget:
        assert cap.outputs, "the timeline widget was not displayed"
    else:
        assert "rank 0: all_reduce [comm]" in cap.stdout
        assert "rank 1: all_reduce [comm]" in cap.stdout


def test_misuse_raises_usage_errors_without_traceback(ip):
    with pytest.raises(UsageError, match=r"--ranks 5: rank 5 not in this world of 2"):
        cell(ip, "pass", "--ranks 5")
    with pytest.raises(UsageError, match="invalid rank list value"):
        cell(ip, "pass", "--ranks x")
    with pytest.raises(UsageError, match="--timeout"):
        cell(ip, "pass", "--timeout -1")


def test_ranks_flag_runs_the_cell_on_those_ranks_only(ip):
    out = cell(ip, "print('here', rank)", "--ranks 1").stdout
    assert out.strip() == "[rank 1] here 1"


def test_magic_help_shows_real_examples(ip):
    doc = ip.find_line_magic("dist_start").__doc__
    assert "%dist_start -n 4 --backend cpu" in doc and "--devices" in doc


def test_control_traffic_is_loopback_and_authenticated(ip):
    import json
    import socket

    w = current_world()
    assert w.client.session.key, "ipyparallel messages must be HMAC-signed"
    assert all("127.0.0.1" in str(url) for url in (w.client._query_socket.LAST_ENDPOINT,))
    # the debugger relay drops a peer that does not know the token
    before = w.relay.rejected
    with socket.create_connection((w.relay.host, w.relay.port), timeout=5) as s:
        f = s.makefile("rb")
        json.loads(f.readline())  # the nonce
        s.sendall(json.dumps({"rank": 0, "mac": "0" * 64}).encode() + b"\n")
        assert f.readline() == b""  # closed on us
    deadline = time.monotonic() + 5
    while w.relay.rejected == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.relay.rejected == before + 1
    assert w.relay.host == "127.0.0.1"


def test_trace_summary_without_the_widget_counts_spans_per_rank_and_name():
    from commlab.magics.dist import _trace_summary

    spans = [{"rank": r, "kind": "comm", "name": "all_reduce", "start_us": 0.0, "end_us": 5.0}
             for r in (0, 1, 1)]
    text = _trace_summary(spans)
    assert "trace: 3 spans" in text
    assert "rank 0: all_reduce [comm] x1 5 us" in text
    assert "rank 1: all_reduce [comm] x2 10 us" in text
    assert "no spans recorded" in _trace_summary([])


def _shown(ip, source: str) -> list[str]:
    """The lines a notebook cell shows (its traceback included), ANSI colours removed."""
    from IPython.utils.capture import capture_output

    from commlab.engine._report import strip_ansi

    with capture_output() as cap:
        ip.run_cell(source, store_history=True)
    return [ln for ln in strip_ansi(cap.stdout + cap.stderr).splitlines() if ln.strip()]


def test_shape_mismatch_on_ranks_shows_the_cell_line_and_the_message_in_a_few_lines(ip):
    n = ip.execution_count
    shown = _shown(ip, "%%distributed\nx = torch.ones(4 + rank)\ny = commlab.all_gather(x)\n")
    text = "\n".join(shown)
    assert len(shown) <= 8, text
    assert "RankMismatchError on ranks 0, 1 (of 2)" in text
    # the notebook's cell, not the engine's counter; the line as JupyterLab numbers it
    assert f"Cell In[{n}], line 3" in text, text
    assert "----> 3 y = commlab.all_gather(x)" in text, text
    assert "_common.py" not in text and "_control.py" not in text, text
    assert "commlab/Triton frame" in text  # says that frames were hidden, and where they are
    assert "_control.py" in __import__("sys").last_value.full_traceback
    assert_world_works(ip)


def test_shape_mismatch_in_a_local_call_shows_the_users_frame_and_the_message(ip):
    import sys

    import commlab
    import commlab.errors

    ip.run_cell("import commlab, torch\n_local = commlab.init(backend='cpu')")
    try:
        shown = _shown(ip, "a = torch.ones(3, 4).bfloat16()\n"
                           "out = commlab.ag_gemm(a, torch.ones(5, 6).bfloat16())\n")
        text = "\n".join(shown)
        assert len(shown) <= 8, text
        assert "CommlabUsageError" in text and "line 2" in text, text  # nothing mismatched
        assert "out = commlab.ag_gemm(a, torch.ones(5, 6).bfloat16())" in text
        assert "/commlab/" not in text, text
        assert "runtime/_control.py" in sys.last_value.full_traceback
        commlab.errors.FULL_TRACEBACKS = True
        try:
            full = "\n".join(_shown(ip, "commlab.ag_gemm(torch.ones(3, 4).bfloat16(), "
                                        "torch.ones(5, 6).bfloat16())"))
        finally:
            commlab.errors.FULL_TRACEBACKS = False
        assert "_control.py" in full, full
    finally:
        commlab.finalize()


def test_a_kernel_error_names_each_frame_by_its_own_cell_and_hides_triton(ip):
    import sys

    define = ip.execution_count
    _shown(ip, "%%distributed\n@triton.jit\ndef bad_kernel(x_ptr):\n"
               "    tl.store(x_ptr, undefined_name)\n")
    call = ip.execution_count
    shown = _shown(ip, "%%distributed\nx = torch.zeros(1)\nbad_kernel[(1,)](x)\n")
    text = "\n".join(shown)
    assert f"Cell In[{call}], line 3" in text, text  # the launch, in this cell
    assert f"Cell In[{define}], line 4" in text, text  # the kernel's line, in its own cell
    assert "triton/" not in text and "interpreter.py" not in text, text
    assert "commlab/Triton frames hidden" in text, text
    assert len(shown) <= 10, text
    assert "site-packages/triton/" in sys.last_value.full_traceback
    assert_world_works(ip)
