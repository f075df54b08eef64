"""The launch plan's repeated call in C (``collectives/_fastcall.c``): built on first use,
serving repeated calls with every check the Python path makes, and off (the Python path,
said once) without a compiler or with ``COMMLAB_NATIVE=0``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from commlab.runtime import _native
from commlab.testing import run_world
from tests.conftest import assert_checks
from tests.worlds.native import native_world


def test_the_c_fast_path_builds_here():
    # CI installs a C compiler (.ci/run): a build that fails there must fail this test
    mod = _native.load(_native.build())
    assert hasattr(mod, "Entry")


@pytest.fixture(scope="module")
def results():
    return run_world(native_world, 2, timeout=180, env={"COMMLAB_TIMEOUT": "30"})


@pytest.mark.parametrize("section", ["served", "held", "reuse", "mismatch", "inplace"])
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
