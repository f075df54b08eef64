"""Every COMMLAB_* setting is in commlab/_config.py's table, read through it, and documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commlab import _config

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bCOMMLAB_[A-Z0-9_]+\b")
# Python identifiers that happen to start with COMMLAB_ (not environment variables).
NOT_SETTINGS = {"COMMLAB_ALGORITHMS"}  # commlab/bench/_impls.py: the algorithms a benchmark runs


def _files():
    for folder in ("commlab", "magics", "tests", "notebooks", "bench", "scripts", "examples"):
        for p in (ROOT / folder).rglob("*"):
            if p.suffix in (".py", ".sh", ".md", ".ipynb") and "results" not in p.parts:
                yield p
    yield ROOT / "README.md"
    yield ROOT / "ARCHITECTURE.md"


def test_every_commlab_variable_in_the_source_is_in_the_table():
    seen = {}
    for p in _files():
        for m in NAME.finditer(p.read_text(errors="replace")):
            seen.setdefault(m.group(0), str(p.relative_to(ROOT)))
    unknown = {n: f for n, f in seen.items() if n not in _config.VARS and n not in NOT_SETTINGS}
    assert not unknown, f"COMMLAB_ names without a row in commlab/_config.py: {unknown}"


def test_only_the_config_module_reads_commlab_variables():
    reads = re.compile(r"environ(?:\.get)?\s*[\(\[]\s*[\"'](COMMLAB_\w+)")
    bad = []
    for p in (ROOT / "commlab").rglob("*.py"):
        if p.name == "_config.py":
            continue
        bad += [f"{p.relative_to(ROOT)}: {m.group(1)}" for m in reads.finditer(p.read_text())]
    assert not bad, f"read these through commlab._config.get(): {bad}"


def test_the_readme_shows_the_table_as_generated():
    assert _config.table() in (ROOT / "README.md").read_text(), (
        "README's configuration table is stale: paste `python -m commlab._config`")


def test_settings_parse_and_bad_text_names_the_variable(monkeypatch):
    monkeypatch.setenv("COMMLAB_HEAP_SIZE", "20MiB")
    assert _config.get("COMMLAB_HEAP_SIZE") == 20 << 20
    monkeypatch.setenv("COMMLAB_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="COMMLAB_TIMEOUT='soon'"):
        _config.get("COMMLAB_TIMEOUT")
    monkeypatch.delenv("COMMLAB_TIMEOUT")
    assert _config.get("COMMLAB_TIMEOUT") == 300.0
    with pytest.raises(KeyError, match="not a commlab setting"):
        _config.get("COMMLAB_" + "NOPE")  # built so the source scan skips it


@pytest.mark.parametrize("text,expected", [("64KiB", 64 << 10), ("1G", 1 << 30),
                                           ("1048576", 1 << 20), ("1.5MiB", 3 << 19)])
def test_sizes_use_binary_units(text, expected):
    assert _config.parse_size(text) == expected


@pytest.mark.parametrize("backend, records, expected", [
    ("cpu", None, True),  # the default records in the interpreter
    ("cuda", None, False),  # and not in compiled kernels (0.5 us of a 1.9 us GPU call)
    ("cuda", "1", True),
    ("cpu", "0", False),
])
def test_call_records_default_to_the_cpu_backend_and_the_kernels_follow_the_runtime(
        backend, records, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("COMMLAB_RECORDS", "TRITON_INTERPRET")}
    env["COMMLAB_BACKEND"] = backend
    if records is not None:
        env["COMMLAB_RECORDS"] = records
    code = ("import commlab.language as cl, commlab.runtime.records as r; "
            "print(bool(cl.RECORDS), r.enabled())")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(expected), str(expected)]
