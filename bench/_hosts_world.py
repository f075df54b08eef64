"""Run a benchmark script as a torchrun world on 2 simulated hosts x 2 ranks (root: see
tests/_hosts.py). The script re-enters itself with ``--worker DIR`` on every rank and
leaves ``DIR/records.json``, which this returns."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_two_hosts(script: str, args: list[str]) -> list[dict]:
    """The records ``script --worker DIR *args`` wrote, run on 2 hosts x 2 ranks."""
    import tempfile

    from tests import _hosts

    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as out:
        ok, text = _hosts.torchrun_world([script, "--worker", out, *args], env, out,
                                         timeout=3600, cwd=str(ROOT))
        if not ok:
            raise SystemExit(f"the benchmark world failed:\n{text}")
        return json.loads(Path(out, "records.json").read_text())
