"""Observe a world across hosts: torchrun on 2 simulated hosts x 2 ranks (tests/_hosts.py)
calls only public names (tests/worlds/hosts_observe.py); one world for every check.

Needs root (CI runs as root); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from commlab import costmodel
from commlab.topology import LinkBenchResult, Topology
from tests import _hosts

ROOT = Path(__file__).resolve().parent.parent
HOSTS, PER_HOST = 2, 2


@pytest.fixture(scope="module")
def results():
    why = _hosts.unavailable()
    if why:
        pytest.skip(why)
    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "COMMLAB_TIMEOUT": "60",
           "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as out:
        ok, text = _hosts.torchrun_world(["-m", "tests.worlds.hosts_observe", out], env, out,
                                         HOSTS, PER_HOST, timeout=240, cwd=str(ROOT))
        files = sorted(Path(out).glob("rank*.json"))
        if len(files) != HOSTS * PER_HOST or not ok:
            pytest.fail(f"the observed world across hosts did not finish:\n{text}",
                        pytrace=False)
        return [json.loads(f.read_text()) for f in files]


def test_world_topology_has_two_hosts_with_their_ranks_and_a_net_link(results):
    topo = Topology.from_dict(results[0]["topology"])
    assert all(r["topology"] == results[0]["topology"] for r in results)  # every rank's
    hosts = topo.hosts()
    assert sorted(hosts) == ["host0", "host1"]
    assert {h: sorted(n for n in ids if n.startswith("rank")) for h, ids in hosts.items()} == \
        {"host0": ["rank0", "rank1"], "host1": ["rank2", "rank3"]}
    assert topo.node("host0").label == results[0]["hostname"] != topo.node("host1").label
    net = topo.edge("nic0", "nic1")
    assert net is not None and net.kind == "net"
    assert "10.77." in net.attrs["interfaces"]  # each host's veth address
    assert net.measured_gbps and net.measured_gbps > 0
    assert topo.edge("rank0", "rank1").kind == "shm"
    assert topo.edge("rank0", "rank2").attrs["via"] == "nic0-nic1"


def test_linkbench_measures_cross_host_pairs_with_send_recv_and_labels_them(results):
    res = LinkBenchResult.from_dict(results[0]["linkbench"])
    assert res.hosts == [[0, 1], [2, 3]]
    cross = res.cross_host
    assert cross == results[0]["cross_host"]
    assert [[cross[i][j] for j in range(4)] for i in range(4)] == \
        [[i // 2 != j // 2 for j in range(4)] for i in range(4)]
    assert "send/recv" in res.meta["cross_host_method"]
    for m in res.methods:  # every pair measured (each checked before it was timed)
        for si in range(len(res.sizes)):
            assert all(v > 0 for row in res.gbps[m][si] for v in row), (m, si)
    # one send/recv figure per cross pair, whatever the method
    a, b = res.matrix("triton"), res.matrix("memcpy")
    assert all(a[i][j] == b[i][j] for i in range(4) for j in range(4) if cross[i][j])
    pct = res.percent_of_peak("memcpy")
    assert all(pct[i][j] is None for i in range(4) for j in range(4) if cross[i][j])


def test_hierarchical_projection_is_made_from_the_levels_the_world_measured(results):
    """The projection's closeness to what was measured is bench/hier_costmodel.py's goal
    (a 2-core CI machine running other tests times nothing reliably); here: every size the
    world measured gets a projection from fitted levels, the split path only above 1 MiB."""
    check = costmodel.check_hierarchical(results[0]["levels"])
    assert [r["split"] for r in check["rows"]] == [False, False, True]
    for level in (check["inside"], check["between"]):
        assert level["alpha_us"] >= 0 and level["beta_gbps"] > 0, check
    for r in check["rows"]:
        assert r["measured_us"] > 0 and 0 < r["projected_us"] < float("inf"), r
        assert r["ratio"] == pytest.approx(r["projected_us"] / r["measured_us"])


def _rows_across_hosts() -> list[dict]:
    """Rows as ``linkbench.rank_run`` returns them on 2 hosts x 2 ranks (synthetic rates:
    10 GB/s through a host's memory, 0.5 between hosts, 20 local)."""
    def rate(i, j):
        return 20.0 if i == j else 10.0 if i // 2 == j // 2 else 0.5
    return [{"rank": i, "world_size": 4, "backend": "cpu", "device": "cpu", "sizes": [4096],
             "methods": ["memcpy"], "hosts": [[0, 1], [2, 3]],
             "gbps": {"memcpy": [[rate(i, j) for j in range(4)]]}} for i in range(4)]


def test_linkbench_view_gives_pairs_between_hosts_their_own_scale_and_label():
    from commlab.widgets import LinkBenchView
    from commlab.widgets._linkbench import curves, heatmap_data

    res = LinkBenchResult.from_rows(_rows_across_hosts())
    d = heatmap_data(res, "memcpy")
    assert d["z_cross"][0] == [None, None, 0.5, 0.5] and d["z_local"][0] == [20, 10, None, None]
    assert d["zmax"] == 20 and d["zmax_cross"] == 0.5  # neither scale washes the other out
    assert "between hosts" in d["text"][0][2] and "% of local copy" in d["text"][0][1]
    assert d["x"][2] == "rank 2 · host 1"
    assert [c["name"] for c in curves(res, "memcpy")][2] == "0←2 (between hosts)"
    v = LinkBenchView(res)
    assert len(v.heatmap.data) == 2 and v.heatmap.data[1].colorscale[0][1] != \
        v.heatmap.data[0].colorscale[0][1]


def test_seed_claim_table_sets_the_claim_beside_the_projection_with_its_assumptions():
    two = costmodel.Fit("commlab:two_shot", "two_shot", 5.0, 300.0, 0.05, 0.1, 12)
    got = costmodel.seed_claim(two)
    m = costmodel.multi_node(128)
    n = costmodel.implied_by_claim(12.3, 0.82, m)["bytes"]
    assert got["bytes"] == pytest.approx(n) and 230 < n / 2**20 < 250
    assert got["hierarchical_ms"] == pytest.approx(costmodel.hierarchical_us(two, m, n) / 1e3)
    assert got["ring_ms"] == pytest.approx(costmodel.predict_us("nccl_ring", 5.0, 50.0, n, 1024)
                                           / 1e3)
    table = costmodel.claim_table(got)
    for want in ("| 12.3 |", "| 18.7 |", "82%", "50 GB/s", "5 µs", "241 MiB", "1024 GPUs"):
        assert want in table, want


def test_check_hierarchical_recovers_the_levels_it_was_given():
    """Records made from known alphas and betas: the fit finds them and the projection
    equals hierarchical_us on that machine (ratio 1), on both sides of the split."""
    a_in, b_in, a_x, b_x = 2000.0, 0.2, 500.0, 0.3
    recs = []
    for n in (4 << 10, 256 << 10, 2 << 20):
        inside = costmodel.predict_us("two_shot", a_in, b_in, n, 2)
        between = costmodel.predict_us("nccl_ring", a_x, b_x, n, 2)
        shard = costmodel.predict_us("nccl_ring", a_x, b_x, n // 2, 2)
        f = costmodel.Fit("inside", "two_shot", a_in, b_in, 0, 0, 3)
        m = costmodel.Machine("2x2", 4, 2, inter_gbps=b_x, inter_alpha_us=a_x)
        hier = costmodel.hierarchical_us(f, m, n, split=n > 1 << 20, latency="call")
        recs += [{"impl": "inside", "bytes": n, "world_size": 2, "time_us": inside},
                 {"impl": "between", "bytes": n, "world_size": 2, "time_us": between},
                 {"impl": "between", "bytes": n // 2, "world_size": 2, "time_us": shard},
                 {"impl": "commlab:hier", "bytes": n, "world_size": 4, "time_us": 1.1 * hier}]
    got = costmodel.check_hierarchical(recs)
    assert got["inside"]["alpha_us"] == pytest.approx(a_in)
    assert got["between"]["beta_gbps"] == pytest.approx(b_x)
    assert [r["ratio"] for r in got["rows"]] == pytest.approx([1 / 1.1] * 3)
