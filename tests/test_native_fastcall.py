"""The launch plan's repeated call in C (``collectives/_fastcall.c``): built on first use,
serving repeated calls with every check the Python path makes, and off (the Python path,
said once) without a compiler or with ``COMMLAB_NATIVE=0``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from commlab.runtime import _native
from commlab.testing import run_world
from tests.conftest import assert_checks
from tests.worlds.native import native_world


def test_the_c_fast_path_builds_here():
    # CI installs a C compiler (.ci/run): a build that fails there must fail this test
    mod = _native.load(_native.build())
    blank = mod.Entry.__new__(mod.Entry)  # never initialized: refuses, does not crash
    with pytest.raises(RuntimeError, match="not initialized"):
        blank(torch.ones(1))
    assert mod.Dispatch()((torch.ones(1),), {}) is None  # no call form remembered yet


@pytest.fixture(scope="module")
def results():
    return run_world(native_world, 2, timeout=180, env={"COMMLAB_TIMEOUT": "30"})


@pytest.mark.parametrize("section", ["served", "held", "reuse", "mismatch", "online", "inplace"])
def test_repeated_calls_in_c(results, section):
    assert_checks(results, section)


def test_a_mismatch_behind_a_c_call_names_both_ranks_values(results):
    assert "op differs across ranks (rank 0: sum, rank 1: max)" in results[0]["texts"]["mismatch"]


_ONE_RANK = textwrap.dedent("""
    import warnings, torch, commlab
    warnings.simplefilter("always")
    comm = commlab.init(backend="cpu")
    x = torch.ones(8)
    for _ in range(4):
        y = commlab.all_reduce(x)
    assert torch.equal(y, x)
    print("entries", sum(p.entry is not None for p in comm.plans.values()))
    commlab.finalize()
""")


@pytest.mark.parametrize("env, entries, warned", [
    ({"COMMLAB_NATIVE": "0"}, 0, False),
    ({"CC": "/bin/false"}, 0, True),  # a fresh cache and a compiler that fails
])
def test_without_the_c_path_calls_take_the_python_plan(tmp_path, env, entries, warned):
    full = {**os.environ, "COMMLAB_BACKEND": "cpu", "COMMLAB_NATIVE_DIR": str(tmp_path), **env}
    done = subprocess.run([sys.executable, "-c", _ONE_RANK], capture_output=True, text=True,
                          env=full, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"entries {entries}" in done.stdout
    assert ("the C fast path for repeated calls is off" in done.stderr) == warned, done.stderr


_BUDGET = textwrap.dedent("""
    import torch, commlab
    from commlab.runtime import _native
    comm = commlab.init(backend="cpu")
    x = torch.ones(8)
    for _ in range(2):
        commlab.all_reduce(x, algorithm="one_shot")
    entry = next(p.entry for p in comm.plans.values() if p.entry is not None)
    mod = _native.module()
    d, b, h0 = mod.Dispatch(), mod.Budget(), entry.hits
    d.remember((x,), {"algorithm": "auto"}, entry, b)
    call = lambda: d((x,), {"algorithm": "auto"})
    assert call() is None and entry.hits == h0, "served with no calls granted"
    b.left = 2
    assert call() is not None and call() is not None and call() is None
    assert (b.left, b.used, entry.hits - h0) == (0, 2, 2), (b.left, b.used, entry.hits)
    assert b.take() == 2 and (b.left, b.used) == (0, 0)
    b.left = 5
    d.remember((x,), {"algorithm": "auto"}, entry)  # the same form again: replaced, no budget
    for _ in range(7):
        assert call() is not None
    assert (b.left, b.used, entry.hits - h0) == (5, 0, 9), (b.left, b.used, entry.hits)
    try:
        d.remember((x,), {}, entry, 3)
    except TypeError as e:
        print("refused:", e)
    commlab.finalize()
    print("budget ok")
""")


def test_a_budgeted_call_form_is_served_only_for_the_calls_granted():
    # online selection's call forms: the Dispatch serves what the Budget grants, counts
    # them for Python, and a form remembered again replaces its slot
    out = _run_script(_BUDGET)
    assert "budget ok" in out and "refused: remember: budget must be a Budget or None" in out


def _run_script(script: str) -> str:
    """Run ``script`` in a fresh CPU-backend interpreter; its stdout (it must succeed)."""
    full = {**os.environ, "COMMLAB_BACKEND": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=full, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


_ENTRY = textwrap.dedent("""
    import torch, commlab
    from commlab.collectives import _launcher, _outputs
    from commlab.runtime import _ahead, _control, _native, records
    from commlab.trace._recorder import RECORDER
    comm = commlab.init(backend="cpu")
    x = torch.ones(64)
    for _ in range(3):
        commlab.all_reduce(x)
    plan = next(iter(comm.plans.values()))
    mod, b, outs = _native.module(), comm.control, plan.outputs
    calls, flags = [], {"profiler": False, "hook": False, "capturing": False}
    layout = (b.RING, b.SLOT_WORDS, b.world_size * _control.RING * _control.SLOT >> 3,
              _control._STATE >> 3, b.checked_word, b.rank)
    entry = mod.Entry(b, plan.record, tuple(b.peers), _ahead.SYNC_HOOK, _ahead.CALLER, layout,
                      (outs.tensors, outs.storages, outs.slots), outs.take, _outputs.REUSE,
                      torch._C._storage_Use_Count, _native.free_refs(mod), 0,
                      lambda *a: calls.append(a), ("gx", "gy", "gz"), ("fn", "meta"), ("tail",),
                      (11, 12), True, lambda dev: 77, lambda: flags["capturing"],
                      lambda: flags["hook"], RECORDER, lambda: flags["profiler"],
                      records.LAUNCHES, None, ("all_reduce", "one_shot", 256, "float32"))
""")

_GPU_BRANCH = _ENTRY + textwrap.dedent("""
    before = records.LAUNCHES[0]
    y = entry(x)
    assert calls == [("gx", "gy", "gz", 77, "fn", "meta", x.data_ptr(), y.data_ptr(), 11, 12,
                      "tail")], calls
    assert records.LAUNCHES[0] == before + 1
    p = y.data_ptr()
    del y
    assert entry(x).data_ptr() == p, "a dropped output was not handed out again"
    flags["capturing"] = True
    kept = entry(x)
    assert kept.data_ptr() != p, "an output reused while capturing"
    flags["capturing"] = False
    for flag in ("profiler", "hook"):
        flags[flag] = True
        n = len(calls)
        assert entry(x) is None and len(calls) == n, f"launched with the {flag} on"
        flags[flag] = False
    entry.set_capture_choice(True)  # "auto" of an op that chooses afresh inside a capture
    flags["capturing"] = True
    assert entry(x) is None, "a capture_choice call ran its plan inside a capture"
    flags["capturing"] = False
    out = torch.empty(64)
    assert entry(x, out) is out and calls[-1][7] == out.data_ptr()
    assert entry(x[1:], out) is None, "launched an input off the kernel's alignment"
    print("hits", entry.hits)
    commlab.finalize()
""")


def test_the_gpu_branch_fills_the_launchers_arguments_and_declines_what_it_must():
    # the C entry's GPU branch with a recording launcher, on CPU tensors: the argument
    # layout, the call counter, output reuse, captures, and a profiler or launch hook
    assert "hits 4" in _run_script(_GPU_BRANCH)


_RAW_BRANCH = _ENTRY + textwrap.dedent("""
    import ctypes
    P = ctypes.POINTER(ctypes.c_void_p)
    LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                              ctypes.c_void_p, P, ctypes.c_void_p)
    CTX = ctypes.CFUNCTYPE(ctypes.c_int, P)
    ERROR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
    CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
    raw, state = [], {"ctx": 1, "rc": 0, "capturing": 0, "capture_rc": 0}
    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = [ctypes.c_uint64.from_address(params[i]).value for i in range(5)]
        raw.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, values))
        return state["rc"]
    def ctx(out):
        out[0] = state["ctx"]
        return 0
    def error(code, text):
        text[0] = b"an illegal memory access was encountered"
        return 0
    def capturing(stream, status):
        status[0] = state["capturing"]
        return state["capture_rc"]
    fns = [LAUNCH(launch), CTX(ctx), ERROR(error), CAPTURING(capturing)]
    addr = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in fns)
    entry.set_raw(0xF00, (3, 1, 1), 128, 512, (0, 0, 11, 2**64 - 1, 0x3FC00000), addr, plan)
    y = entry(x)
    assert raw == [(0xF00, (3, 1, 1), (128, 1, 1), 512, 77,
                    [x.data_ptr(), y.data_ptr(), 11, 2**64 - 1, 0x3FC00000])], raw
    assert calls == [] and entry.raw_launches == 1, (calls, entry.raw_launches)
    p = y.data_ptr()
    del y
    state["capturing"] = 1  # the driver's answer, not torch's: a capture gets its own output
    assert entry(x).data_ptr() != p, "an output reused while the driver said capturing"
    state["capturing"], state["capture_rc"] = 0, 1  # the driver cannot tell: torch's answer
    flags["capturing"] = True
    assert entry(x).data_ptr() != p, "an output reused while torch said capturing"
    flags["capturing"], state["capture_rc"] = False, 0
    assert entry(x).data_ptr() == p, "a dropped output was not handed out again"
    entry.set_capture_choice(True)  # "auto" choosing afresh in a capture: the driver asked
    state["capturing"] = 1
    n = len(raw)
    assert entry(x) is None and len(raw) == n, "a capture_choice call ran inside a capture"
    state["capturing"] = 0
    assert entry(x) is not None and len(raw) == n + 1
    entry.set_capture_choice(False)
    state["ctx"] = None  # no CUDA context on this thread: Triton's launcher makes one
    entry(x)
    assert len(calls) == 1 and len(raw) == 5, (calls, raw)
    state["ctx"], state["rc"] = 1, 700
    try:
        entry(x)
    except RuntimeError as e:
        said = "cuLaunchKernel failed: an illegal memory access was encountered (CUDA error 700)"
        assert said in str(e), e
    else:
        raise AssertionError("a failed launch raised nothing")
    state["rc"] = 0
    for bad in ((0,), (0,) * 65):
        try:
            entry.set_raw(0xF00, (3, 1, 1), 128, 0, bad, addr, plan)
        except ValueError as e:
            assert "2 to 64 parameters" in str(e), e
        else:
            raise AssertionError(f"set_raw took {len(bad)} parameters")
    print("raw", entry.raw_launches)
    commlab.finalize()
""")


def test_our_own_launch_passes_the_parameter_block_and_falls_back_without_a_context():
    # the C entry's cuLaunchKernel branch with recording driver functions (ctypes) on CPU
    # tensors: grid, block, shared memory, stream, every parameter; no context on the
    # thread: Triton's launcher; a failed launch: the driver's own words
    assert "raw 5" in _run_script(_RAW_BRANCH)
