"""PyTorch's own distributed tests on the "commlab" backend (tests/torch_suite): the tests
tagged ``ci`` in tests/torch_suite/status.txt on every push (worlds of 2 and 3, about a
minute on 2 cores), every test under ``-m slow`` (about 5 minutes). Each result must be the
one status.txt lists, and at least 80% of the tests whose calls include an op commlab has
kernels for must reach them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.torch_suite import _status, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _suite(tmp_path, *args: str, limit: int) -> dict:
    out = tmp_path / "results.json"
    env = dict(os.environ, COMMLAB_BACKEND="cpu", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "tests.torch_suite.run", "--check",
                        "--json", str(out), *args], cwd=ROOT, env=env, timeout=limit,
                       capture_output=True, text=True)
    summary = p.stdout
    assert p.returncode == 0, summary + p.stderr[-4000:]
    results = json.loads(out.read_text())
    for world, records in results.items():
        r = run.reach(records)
        native, collective = len(r["kernels"]), len(r["kernels"]) + len(r["fallback_only"])
        assert native >= 0.8 * collective, (world, r["fallback_only"], summary)
    return results


def test_the_ci_tests_of_torchs_suite_give_the_listed_results(tmp_path):
    results = _suite(tmp_path, "--only-listed", "ci", limit=600)
    listed = {n for n, e in _status.read(run.STATUS).items() if "ci" in e.tags}
    assert set(results["2"]) == set(results["3"]) == listed


@pytest.mark.slow
def test_all_of_torchs_suite_gives_the_listed_results(tmp_path):
    results = _suite(tmp_path, limit=1800)
    assert set(results["2"]) == set(_status.read(run.STATUS))


def test_status_txt_gives_a_reason_for_every_skip_and_expected_failure():
    entries = _status.read(run.STATUS)
    assert len(entries) > 250
    for name, e in entries.items():
        if set(e.statuses.values()) - {"pass"}:
            assert e.reason, f"{name}: {e.statuses} without a reason"
        if "xfail" in e.statuses.values():
            assert "ci" in e.tags, f"{name}: an expected failure is checked in CI"
