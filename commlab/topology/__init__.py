"""Topology: what devices a world runs on and how they are linked, with where each fact
came from; saved as JSON so a topology recorded on a cluster can be explored anywhere.

    from commlab import topology
    t = topology.discover()              # NVML, `nvidia-smi topo -m`, `rocm-smi`, else CPUs
    t.save("mybox.json"); topology.Topology.load("mybox.json")
    topology.sample("8xh100-nvswitch")   # documented teaching topologies (package data)
    print(topology.format_matrix(t))     # a `topo -m` style matrix
    topology.of_world()                  # every rank of a world: its ranks, hosts, links
    topology.linkbench.run()             # every rank: the bandwidth of every rank pair
"""

from __future__ import annotations

import json
from importlib import resources

from commlab.topology._bench_result import LinkBenchResult
from commlab.topology._discover import discover
from commlab.topology._matrix import LEGEND, format_matrix, topo_matrix
from commlab.topology._model import Edge, Link, Node, Topology
from commlab.topology._nvml import available as nvml_available
from commlab.topology._remote import bench_and_info, call_with_comm, probe, probe_with_queue
from commlab.topology._world import of_world, rank_info, world_topology
from commlab.topology.routes import ROUTES, Route, route


def samples() -> dict[str, str]:
    """Shipped topologies: name -> description."""
    out = {}
    for f in sorted(resources.files("commlab.topology").joinpath("data").iterdir(),
                    key=lambda f: f.name):
        if f.name.endswith(".json"):
            d = json.loads(f.read_text())
            if d.get("schema") == "commlab.topology/1":
                out[f.name[:-5]] = d.get("description", "").split("\n")[0]
    return out


def sample(name: str) -> Topology:
    """A shipped topology by name (see ``samples()``), e.g. "2xh200-nv18"."""
    f = resources.files("commlab.topology").joinpath("data", f"{name}.json")
    if not f.is_file():
        raise ValueError(f"no sample topology {name!r}; choose one of {', '.join(samples())}")
    return Topology.from_dict(json.loads(f.read_text()))


def fingerprint(topology: Topology) -> str:
    """A short stable id of the device graph (device kinds and path classes), for keying
    tuning tables by topology."""
    import hashlib

    devs = topology.devices()
    sig = [n.label.split(" ", 1)[-1] for n in devs]
    sig += [topology.path_class(a.id, b.id) for a in devs for b in devs]
    return hashlib.sha1("|".join(sig).encode()).hexdigest()[:12]


__all__ = ["Edge", "LEGEND", "Link", "LinkBenchResult", "Node", "ROUTES", "Route", "Topology",
           "bench_and_info", "call_with_comm", "discover", "fingerprint", "format_matrix",
           "nvml_available", "of_world", "probe", "probe_with_queue", "rank_info", "route",
           "sample", "samples", "topo_matrix", "world_topology"]
