"""Linkbench and world observation on real ranks: one 2-rank CPU world for the module
(a world start costs seconds), plus a GPU variant."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch

from commlab.topology import linkbench, world_topology
from commlab.topology._bench_result import LinkBenchResult
from commlab.trace import load_torch_trace, overlap_metrics
from commlab.widgets import TopologyExplorer, show_timeline

SIZES = (4096, 65536)


def observe_rank(comm):
    """Everything the observe layer needs from a rank, in one world."""
    import commlab
    from commlab.topology._remote import bench_and_info

    out = bench_and_info(comm, SIZES, 2, ("triton", "memcpy"))
    commlab.trace.start()
    a = torch.randn(64, 64)
    with commlab.trace.span("matmul"):
        a @ a
    x = torch.full((1024,), float(comm.rank + 1))
    out["sum"] = commlab.all_reduce(x)[0].item()
    out["spans"] = [dict(s.to_dict(), rank=comm.rank) for s in commlab.trace.stop()]
    with torch.profiler.profile() as prof:
        commlab.trace.start()  # commlab's collectives label themselves while tracing
        commlab.all_reduce(x)
        a @ a
        commlab.trace.stop()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            out["profile"] = json.load(f)
    return out


@pytest.fixture(scope="module")
def observed():
    from commlab.testing import run_world

    return run_world(observe_rank, 2, timeout=240, env={"COMMLAB_TIMEOUT": "60"})


def test_every_ordered_pair_is_measured_and_verified(observed):
    res = LinkBenchResult.from_rows([o["row"] for o in observed])
    assert res.sizes == list(SIZES) and res.methods == ["triton", "memcpy"]
    for m in res.methods:
        for si in range(len(SIZES)):
            mat = res.gbps[m][si]
            assert all(v > 0 for row in mat for v in row), (m, mat)
    # peaks on CPU: each reader's own local memcpy bandwidth, so % of peak is defined
    assert all(p is not None and p > 0 for row in res.peak for p in row)
    assert "local copy" in res.peak_source


def test_world_topology_has_shared_memory_edges_with_measured_bandwidth(observed):
    res = LinkBenchResult.from_rows([o["row"] for o in observed])
    topo = world_topology([o["info"] for o in observed], res)
    assert topo.ranks == {0: "rank0", 1: "rank1"}
    (e,) = topo.edges
    assert (e.kind, e.path) == ("shm", "SHM") and e.measured_gbps > 0
    assert "linkbench" in e.source
    # the readers' local copy rate is a measured reference, not the shared-memory link's peak
    assert e.peak_gbps == 0.0 and e.attrs["reference GB/s (reader's local copy, measured)"] > 0
    assert topo.node("rank1").attrs["pid"] == observed[1]["info"]["pid"]
    TopologyExplorer(topo).select_edge(0)


def test_traced_collectives_and_compute_feed_the_timeline(observed):
    assert [o["sum"] for o in observed] == [3.0, 3.0]
    spans = [s for o in observed for s in o["spans"]]
    kinds = {(s["rank"], s["kind"], s["name"]) for s in spans}
    assert {(r, "comm", "all_reduce") for r in (0, 1)} <= kinds
    assert {(r, "compute", "matmul") for r in (0, 1)} <= kinds
    v = show_timeline(spans)
    assert v.model.lanes() == ["rank 0", "rank 1"]
    assert set(overlap_metrics(spans)) == {0, 1}


def test_profiler_trace_shows_commlab_collectives_as_communication(observed):
    spans = load_torch_trace(observed[1]["profile"], rank=1)
    comm = [s for s in spans if s.kind == "comm"]
    assert any(s.name == "commlab:all_reduce" for s in comm), sorted({s.name for s in spans})
    assert any(s.kind == "compute" for s in spans)


def test_a_wrong_copy_is_reported_with_the_rank_and_element():
    got = linkbench._pattern(0, 64, "cpu")
    with pytest.raises(RuntimeError, match="copy from rank 1 is wrong at element 0"):
        linkbench._verify(got, 1, "memcpy")


@pytest.mark.gpu
def test_linkbench_on_two_gpus_reaches_nvlink_speeds():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from commlab.testing import run_world
    from commlab.topology._remote import bench_and_info

    outs = run_world(bench_and_info, 2, args=((1 << 20, 64 << 20), 5, ("triton", "memcpy")),
                     backend="cuda", timeout=300)
    res = LinkBenchResult.from_rows([o["row"] for o in outs])
    for m in res.methods:
        big = res.matrix(m)
        assert big[0][1] > 50 and big[1][0] > 50, (m, big)  # GB/s: NVLink, not PCIe
