"""Worlds across hosts: torchrun on 2 simulated hosts x 2 ranks (network namespaces,
each with its own address, hostname and /dev/shm), every public collective checked
against gloo's flat result in the same world (tests/worlds/hosts.py).

Needs root (CI runs as root); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path

import pytest

from tests import _hosts
from tests.conftest import assert_checks

ROOT = Path(__file__).resolve().parent.parent
HOSTS, PER_HOST = 2, 2


@pytest.fixture(scope="module")
def results():
    why = _hosts.unavailable()
    if why:
        pytest.skip(why)
    seed = int(os.environ.get("COMMLAB_TEST_SEED") or secrets.randbelow(1 << 30))
    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "COMMLAB_TIMEOUT": "60",
           "COMMLAB_TEST_SEED": str(seed), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as out:
        ok, text = _hosts.torchrun_world(["-m", "tests.worlds.hosts", out], env, out,
                                         HOSTS, PER_HOST, timeout=300, cwd=str(ROOT))
        files = sorted(Path(out).glob("rank*.json"))
        if len(files) != HOSTS * PER_HOST or not ok:
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


@pytest.mark.slow  # ~40-70 s on 2 cores; the namespace world above is the default CI check
def test_hosts_whose_ranks_torch_numbers_out_of_host_order_still_match_gloo(world, seed):
    """Hosts [[0, 3], [1, 2]] (split on one machine with COMMLAB_HOSTS): the group of
    local index 1 is [2, 3] in torch's numbering but host order is (3, 2)."""
    from tests.worlds.hosts import hosts_world

    results = world(hosts_world, 4, seed, ((0, 3), (1, 2)), timeout=300,
                    env={"COMMLAB_HOSTS": "0,3;1,2"})
    for section in ("shape", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                    "broadcast", "ag_gemm", "gemm_rs", "errors", "torch_backend"):
        assert_checks(results, section)


def test_commlab_hosts_override_reads_sizes_and_named_hosts_and_refuses_the_rest():
    from commlab.errors import CommlabUsageError
    from commlab.runtime._hosts import _classes, _forced

    assert _forced("2", 4) == [[0, 1], [2, 3]]
    assert _forced("0,3; 1,2", 4) == [[0, 3], [1, 2]]
    for bad in ("3", "0,1;1,2", "0,1", "x"):
        with pytest.raises(CommlabUsageError, match="COMMLAB_HOSTS"):
            _forced(bad, 4)
    assert _classes([[0, 2], [1, 3], [0, 2], [1, 3]]) == [[0, 2], [1, 3]]
    with pytest.raises(CommlabUsageError, match="not one clean partition"):
        _classes([[0, 1], [1], [2]])  # rank 0 opens rank 1's memory, rank 1 not rank 0's
