"""Worlds across hosts: torchrun on 2 simulated hosts x 2 ranks (network namespaces,
each with its own address, hostname and /dev/shm), every public collective checked
against gloo's flat result in the same world (tests/worlds/hosts.py).

Needs root (CI runs as root); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import _hosts
from tests.conftest import assert_checks

ROOT = Path(__file__).resolve().parent.parent
HOSTS, PER_HOST = 2, 2


def _torchrun(host: _hosts.Host, node: int, master: str, port: int, out: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS),
            "--node-rank", str(node), "--nproc-per-node", str(PER_HOST),
            "--master-addr", master, "--master-port", str(port), "--max-restarts", "0",
            "-m", "tests.worlds.hosts", out]


@pytest.fixture(scope="module")
def results():
    why = _hosts.unavailable()
    if why:
        pytest.skip(why)
    seed = int(os.environ.get("COMMLAB_TEST_SEED") or secrets.randbelow(1 << 30))
    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "COMMLAB_TIMEOUT": "60",
           "COMMLAB_TEST_SEED": str(seed), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as out, _hosts.simulated_hosts(HOSTS) as hosts:
        logs = [open(os.path.join(out, f"node{i}.log"), "w+") for i in range(HOSTS)]
        procs = [h.popen(_torchrun(h, i, hosts[0].addr, 29400, out), env=env, cwd=ROOT,
                         stdout=logs[i], stderr=subprocess.STDOUT)
                 for i, h in enumerate(hosts)]
        deadline = time.monotonic() + 300
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.5)
        text = ""
        for i, f in enumerate(logs):
            f.seek(0)
            text += f"--- host {i} (exit {procs[i].poll()}) ---\n{f.read()[-6000:]}\n"
            f.close()
        files = sorted(Path(out).glob("rank*.json"))
        if len(files) != HOSTS * PER_HOST or any(p.poll() != 0 for p in procs):
            pytest.fail(f"seed={seed}: the world across hosts did not finish:\n{text}",
                        pytrace=False)
        return [json.loads(f.read_text()) for f in files]


def test_each_host_has_its_own_hostname(results):
    names = [r["hostname"] for r in results]
    assert names[0] == names[1] and names[2] == names[3] and names[0] != names[2], names


def test_comm_local_and_host_map_and_context_refusal(results):
    assert_checks(results, "shape")


@pytest.mark.parametrize("section", ["all_reduce", "all_gather", "reduce_scatter",
                                     "all_to_all", "broadcast", "barrier", "ag_gemm",
                                     "gemm_rs"])
def test_collective_across_hosts_matches_gloo(results, section):
    assert_checks(results, section)


def test_torch_distributed_commlab_group_works_across_hosts(results):
    assert_checks(results, "torch_backend")


def test_argument_errors_across_hosts_raise_on_every_rank(results):
    assert_checks(results, "errors")
