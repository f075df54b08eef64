"""commlab.costmodel: the alpha-beta fit recovers known constants and projects sanely."""

from __future__ import annotations

import random

import pytest

from commlab import costmodel as cm

SIZES = [8 << (2 * i) for i in range(14)]  # 8 B .. 512 MiB


def _records(impl, model, alpha, beta, world=2, noise=0.0, seed=0):
    rng = random.Random(seed)
    jitter = lambda: 1 + rng.uniform(-noise, noise)  # noqa: E731
    return [{"op": "all_reduce", "impl": impl, "dtype": "bfloat16", "bytes": n,
             "world_size": world, "mode": "graph",
             "time_us": cm.predict_us(model, alpha, beta, n, world) * jitter()}
            for n in SIZES]


@pytest.mark.parametrize("impl,model,alpha,beta", [
    ("commlab:one_shot", "one_shot", 6.0, 300.0), ("commlab:two_shot", "two_shot", 4.5, 350.0),
    ("commlab:ring", "ring", 3.0, 320.0), ("nccl", "nccl_ring", 4.2, 330.0)])
def test_fit_recovers_known_alpha_and_beta(impl, model, alpha, beta):
    fits = cm.fit(_records(impl, model, alpha, beta), mode="graph")
    f = fits[impl]
    assert f.model == model and f.points == len(SIZES)
    assert f.alpha_us == pytest.approx(alpha, rel=1e-6)
    assert f.beta_gbps == pytest.approx(beta, rel=1e-6)
    assert f.max_error < 1e-9


def test_fit_with_noise_stays_close_and_reports_its_error():
    recs = _records("nccl", "nccl_ring", 8.0, 330.0, noise=0.05, seed=3)
    f = cm.fit(recs, mode="graph")["nccl"]
    assert f.alpha_us == pytest.approx(8.0, rel=0.15)
    assert f.beta_gbps == pytest.approx(330.0, rel=0.15)
    assert 0 < f.median_error <= 0.05 and f.max_error <= 0.11


def test_fit_uses_the_world_size_of_each_record():
    recs = (_records("commlab:ring", "ring", 3.0, 200.0, world=2)
            + _records("commlab:ring", "ring", 3.0, 200.0, world=4))
    f = cm.fit(recs, mode="graph")["commlab:ring"]
    assert (f.alpha_us, f.beta_gbps) == (pytest.approx(3.0), pytest.approx(200.0))


def test_load_store_algorithms_stop_at_the_node_edge():
    f = cm.Fit("commlab:one_shot", "one_shot", 5.0, 300.0, 0, 0, 10)
    assert cm.project_us(f, cm.NVSWITCH_8, 1 << 20) == pytest.approx(5 + 7 * (1 << 20) / 300e3)
    assert cm.project_us(f, cm.multi_node(2), 1 << 20) is None
    ring = cm.Fit("nccl", "nccl_ring", 5.0, 300.0, 0, 0, 10)
    t = cm.project_us(ring, cm.multi_node(4), 1 << 30)
    assert t == pytest.approx(2 * 31 * 5.0 + 2 * (1 << 30) * 31 / 32 / 50e3)  # IB bound


def test_claim_implies_message_size_by_nccl_tests_definitions():
    got = cm.implied_by_claim(12.3, 0.82, cm.multi_node(128))
    busbw = 0.82 * 50
    algbw = busbw * 1024 / 2046
    assert got["busbw_gbps"] == pytest.approx(busbw)
    assert got["bytes"] == pytest.approx(algbw * 1e9 * 12.3e-3)
    assert got["ring_latency_ms"] == pytest.approx(2046 * 5.0 / 1e3)


def test_records_of_other_ops_and_unknown_impls_are_ignored():
    recs = _records("commlab:ring", "ring", 3.0, 200.0)
    recs += [dict(r, op="all_gather") for r in recs] + [dict(r, impl="mystery") for r in recs]
    assert list(cm.fit(recs, mode="graph")) == ["commlab:ring"]


def test_mi300x_sample_is_a_mesh_of_xgmi_links_as_its_topology_sample_says():
    from commlab import topology

    t = topology.sample("8xmi300x-xgmi")
    gpus = t.nodes_of("gpu")
    links = [e for e in t.edges if e.kind == "xgmi"]
    assert cm.MI300X_8.gpus == len(gpus) == 8
    assert len(links) == 8 * 7 // 2  # every pair directly linked
    assert {e.peak_gbps for e in links} == {cm.MI300X_8.mesh_link_gbps}


def test_mesh_projection_gives_a_ring_one_link_and_all_pairs_algorithms_every_link():
    m, n = cm.MI300X_8, 1 << 30
    one = cm.Fit("commlab:one_shot", "one_shot", 5.0, 300.0, 0, 0, 10)
    assert cm.project_us(one, m, n) == pytest.approx(5.0 + n * 7 / (7 * 64e3))
    ring = cm.Fit("commlab:ring", "ring", 3.0, 300.0, 0, 0, 10)
    assert cm.project_us(ring, m, n) == pytest.approx(3.0 * 14 + 2 * n * 7 / 8 / 64e3)
    two = cm.Fit("commlab:two_shot", "two_shot", 4.0, 300.0, 0, 0, 10)
    assert cm.project_us(two, m, n) < cm.project_us(ring, m, n)  # the mesh favours all-pairs


def test_hierarchical_all_reduce_adds_its_levels_and_beats_the_flat_ring_across_nodes():
    two = cm.Fit("commlab:two_shot", "two_shot", 5.0, 300.0, 0, 0, 10)
    m, n = cm.multi_node(4), 1 << 30  # 4 nodes x 8 GPUs, IB 50 GB/s per GPU
    inside = 5.0 + n * 7 / 8 / 300e3  # a reduce-scatter (or an all-gather) inside a node
    between = 2 * 3 * 5.0 + 2 * (n / 8) * 3 / 4 / 50e3  # ring over 4 nodes of n/8
    assert cm.hierarchical_us(two, m, n) == pytest.approx(2 * inside + between)
    small = cm.hierarchical_us(two, m, 4096, split=False)
    assert small == pytest.approx(two.predict_us(4096, 8) + 2 * 3 * 5.0 + 2 * 4096 * 3 / 4 / 50e3)
    ring = cm.Fit("nccl", "nccl_ring", 5.0, 300.0, 0, 0, 10)
    assert cm.hierarchical_us(two, m, n) < cm.project_us(ring, m, n)
