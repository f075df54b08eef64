"""Topology model, discovery, the topo -m parser, shipped samples, routes."""

from __future__ import annotations

import json

import pytest
import torch

from commlab import topology as T
from commlab.topology import _smi, _sysfs
from commlab.topology.nvlink_counters import link_map, rates_from_samples

# Recorded `nvidia-smi topo -m` outputs (tabs and trailing spaces as the tool prints them).
TOPO_2GPU_NV18 = (
    "\t\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\t0-47,96-143\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\t0-47,96-143\t0\t\tN/A\n"
    "NIC0\tSYS\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
    "NIC Legend:\n\n"
    "  NIC0: mlx5_0\n"
)
TOPO_4GPU_PCIE = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPIX\tSYS\tSYS\t0-15\t0\t\tN/A\n"
    "GPU1\tPIX\t X \tSYS\tSYS\t0-15\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tPXB\t16-31\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tPXB\t X \t16-31\t1\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n"
)


def test_topo_m_parser_reads_nvlink_bonds_nics_and_affinity():
    t = _smi.parse_topo_m(TOPO_2GPU_NV18)
    assert [n.id for n in t.nodes] == ["gpu0", "gpu1", "nic0"]
    e = t.edge("gpu0", "gpu1")
    assert (e.kind, e.path, e.attrs["link_count"]) == ("nvlink", "NV18", 18)
    assert e.peak_gbps == pytest.approx(18 * 26.562, rel=1e-4)
    assert t.path_class("gpu1", "nic0") == "SYS"
    assert t.node("nic0").attrs["device"] == "mlx5_0"
    assert t.node("gpu0").attrs["cpu_affinity"] == "0-47,96-143"
    assert t.node("gpu0").attrs["numa_node"] == 0


def test_topo_m_parser_reads_pcie_classes_of_a_pcie_box():
    t = _smi.parse_topo_m(TOPO_4GPU_PCIE)
    cls = {(e.a, e.b): e.path for e in t.edges}
    assert cls[("gpu0", "gpu1")] == "PIX"
    assert cls[("gpu2", "gpu3")] == "PXB"
    assert cls[("gpu0", "gpu2")] == "SYS"
    assert all(e.kind == "pcie" for e in t.edges)
    assert t.node("gpu3").attrs["numa_node"] == 1


def test_topo_m_parser_rejects_text_that_is_not_topo_m():
    with pytest.raises(ValueError, match="no header row naming GPU0"):
        _smi.parse_topo_m("Mon Nov 30 06:00:00 2026\n+-----+\n| NVIDIA-SMI 570 |\n")
    with pytest.raises(ValueError, match="no row for GPU1"):
        _smi.parse_topo_m("\tGPU0\tGPU1\nGPU0\t X \tNV4\n")


def test_every_shipped_sample_loads_and_says_where_its_numbers_come_from():
    names = T.samples()
    assert {"2xh200-nv18", "8xh100-nvswitch", "4xpcie"} <= set(names)
    for name in names:
        t = T.sample(name)
        assert t.sources and t.description, name
        assert all(e.source for e in t.edges), name
        assert all(n.source for n in t.nodes), name


def test_h200_sample_is_18_links_at_26_562_gbps():
    e = T.sample("2xh200-nv18").edge("gpu0", "gpu1")
    assert (e.path, e.links_up) == ("NV18", 18)
    assert e.peak_gbps == pytest.approx(478.1, abs=0.1)
    assert sum(lk.speed_gbps for lk in e.links) == pytest.approx(e.peak_gbps)


def test_nvswitch_sample_routes_gpu_pairs_through_the_switch():
    t = T.sample("8xh100-nvswitch")
    assert t.edge("gpu2", "gpu6").attrs["via"] == "nvswitch"
    assert sum(len(t.edge(f"gpu{i}", f"nvswitch{s}").links) for i in [3] for s in range(4)) == 18
    assert all(lk.remote == "FFFFFFFF" for e in t.edges if e.b.startswith("nvswitch")
               for lk in e.links)


def test_topology_round_trips_through_json(tmp_path):
    t = T.sample("8xh100-nvswitch")
    p = t.save(tmp_path / "sub" / "t.json")
    back = T.Topology.load(p)
    assert back.to_dict() == t.to_dict()
    assert back.ranks[3] == "gpu3"


def test_loading_a_topology_of_another_schema_is_refused_with_the_fix(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"schema": "commlab.topology/0", "name": "x"}))
    with pytest.raises(ValueError, match="re-record it"):
        T.Topology.load(p)
    with pytest.raises(FileNotFoundError, match="discover\\(\\).save"):
        T.Topology.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="choose one of"):
        T.sample("16xb200")


def test_matrix_is_formatted_like_topo_m():
    text = T.format_matrix(T.sample("4xpcie"))
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0"]
    assert lines[1].split()[:6] == ["GPU0", "X", "PIX", "SYS", "SYS", "NODE"]


def test_pci_path_class_follows_the_topo_m_legend():
    root = ["pci0000:00", "0000:00:01.0"]
    a = root + ["0000:01:00.0", "0000:02:08.0", "0000:03:00.0"]
    b = root + ["0000:01:00.0", "0000:02:08.0", "0000:04:00.0"]
    c = root + ["0000:01:00.0", "0000:02:10.0", "0000:05:00.0"]
    other_root = ["pci0000:80", "0000:80:01.0", "0000:81:00.0"]
    assert _sysfs.path_class(a, a) == "X"
    assert _sysfs.path_class(a, b) == "PIX"
    assert _sysfs.path_class(a, c) == "PXB"
    assert _sysfs.path_class(a, ["pci0000:00", "0000:00:02.0", "0000:06:00.0"]) == "PHB"
    assert _sysfs.path_class(a, other_root, 0, 0) == "NODE"
    assert _sysfs.path_class(a, other_root, 0, 1) == "SYS"


def test_discover_describes_this_machine_with_its_numa_nodes():
    t = T.discover()
    assert t.nodes_of("cpu"), t.summary()
    cpus = t.nodes_of("cpu")[0]
    assert cpus.attrs["cpus"] and cpus.source.startswith("sysfs")


def test_routes_name_the_flows_of_each_algorithm():
    assert T.route("ring", 4).flows == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert len(T.route("all_to_all", 3).flows) == 6
    assert T.route("broadcast", 3).flows == [(0, 1), (0, 2)]
    with pytest.raises(ValueError, match="choose one of"):
        T.route("tree", 4)
    # on the NVSwitch box a ring crosses each GPU's links to every switch twice (in, out)
    load = T.route("ring", 8).edge_load(T.sample("8xh100-nvswitch"))
    assert load == {(f"gpu{i}", f"nvswitch{s}"): 2 for i in range(8) for s in range(4)}


def test_fingerprint_tells_topologies_apart_and_is_stable():
    a, b = T.sample("2xh200-nv18"), T.sample("4xpcie")
    assert T.fingerprint(a) == T.fingerprint(T.sample("2xh200-nv18"))
    assert T.fingerprint(a) != T.fingerprint(b)


def test_nvlink_counters_become_per_edge_gbps():
    t = T.sample("2xh200-nv18")
    links = link_map(t)
    assert len(links) == 18 and set(links.values()) == {("gpu0", "gpu1")}
    prev = {k: (1000, 0) for k in links}
    # 0.1 s later: 1 GiB more sent on each of 18 links, nothing received
    cur = {k: (1000 + (1 << 20), 0) for k in links}
    rates = rates_from_samples(prev, cur, 0.1, links)
    assert rates[("gpu0", "gpu1")] == pytest.approx(18 * (1 << 30) / 0.1 / 1e9)


@pytest.mark.gpu
def test_nvml_discovery_finds_gpu_pairs_and_their_links():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from commlab.topology import _nvml

    assert _nvml.available(), "NVML failed to initialise on a machine with GPUs"
    t = T.discover()
    assert len(t.nodes_of("gpu")) == torch.cuda.device_count()
    e = t.edge("gpu0", "gpu1")
    assert e is not None and e.source.startswith("nvml")
    if e.kind == "nvlink":
        assert e.peak_gbps > 0 and e.p2p.get("nvlink") == "ok"


def _showtopo_sample() -> str:
    from importlib import resources

    return resources.files("commlab.topology").joinpath("data", "8xmi300x-showtopo.txt").read_text()


def test_showtopo_parser_reads_an_8x_mi300x_node_as_xgmi_links_with_numa_nodes():
    from commlab.topology import _rocm_smi

    t = _rocm_smi.parse_showtopo(_showtopo_sample())
    assert [n.id for n in t.nodes] == [f"gpu{i}" for i in range(8)]
    assert len(t.edges) == 28 and all(e.kind == "xgmi" for e in t.edges)
    e = t.edge("gpu2", "gpu6")
    assert (e.path, e.peak_gbps, e.attrs) == ("XGMI", 64.0, {"weight": 15, "hops": 1,
                                                          "link_count": 1, "direct": True})
    assert [t.node(f"gpu{i}").attrs["numa_node"] for i in range(8)] == [0] * 4 + [1] * 4
    assert t.path_class("gpu0", "gpu7") == "XGMI"
    assert "XGMI" in T.format_matrix(t)


def test_showtopo_parser_reads_pcie_pairs_by_their_hops():
    from commlab.topology import _rocm_smi

    text = (
        "=================== Weight between two GPUs ===================\n"
        "       GPU0         GPU1         GPU2\n"
        "GPU0   0            15           52\n"
        "GPU1   15           0            40\n"
        "GPU2   52           40           0\n"
        "=================== Hops between two GPUs ===================\n"
        "       GPU0         GPU1         GPU2\n"
        "GPU0   0            1            3\n"
        "GPU1   1            0            2\n"
        "GPU2   3            2            0\n"
        "=================== Link Type between two GPUs ===================\n"
        "       GPU0         GPU1         GPU2\n"
        "GPU0   0            XGMI         PCIE\n"
        "GPU1   XGMI         0            PCIE\n"
        "GPU2   PCIE         PCIE         0\n"
        "GPU 0          : (Topology) Numa Node: 0\n")
    t = _rocm_smi.parse_showtopo(text, xgmi_gbps=50.0)
    assert (t.edge("gpu0", "gpu1").kind, t.edge("gpu0", "gpu1").peak_gbps) == ("xgmi", 50.0)
    assert t.path_class("gpu0", "gpu2") == "SYS" and t.path_class("gpu1", "gpu2") == "PHB"


def test_showtopo_parser_rejects_other_text_and_says_what_to_pass():
    from commlab.topology import _rocm_smi

    with pytest.raises(ValueError, match="no 'Link Type between two GPUs' block"):
        _rocm_smi.parse_showtopo(TOPO_2GPU_NV18)
    with pytest.raises(ValueError, match="row GPU1 .* has 1 cells for 2 GPUs"):
        _rocm_smi.parse_showtopo("=== Link Type between two GPUs ===\n  GPU0  GPU1\n"
                                 "GPU0 0 XGMI\nGPU1 XGMI\n")
