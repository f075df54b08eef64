"""Run a benchmark script as a torchrun world on 2 simulated hosts x 2 ranks (root: see
tests/_hosts.py). The script re-enters itself with ``--worker DIR`` on every rank and
leaves ``DIR/records.json``, which this returns."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_two_hosts(script: str, args: list[str]) -> list[dict]:
    """The records ``script --worker DIR *args`` wrote, run on 2 hosts x 2 ranks."""
    from tests import _hosts

    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as out, _hosts.simulated_hosts(2) as hosts:
        procs = [h.popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                          "--node-rank", str(i), "--nproc-per-node", "2", "--master-addr",
                          hosts[0].addr, "--master-port", "29400", script, "--worker",
                          out, *args], env=env, cwd=ROOT) for i, h in enumerate(hosts)]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("the benchmark world failed (its output is above)")
        return json.loads(Path(out, "records.json").read_text())
