"""Topology: what devices a world runs on and how they are linked, with where each fact
came from; saved as JSON so a topology recorded on a cluster can be explored anywhere.

    from commlab import topology
    t = topology.discover()              # NVML, `nvidia-smi topo -m`, `rocm-smi`, else CPUs
    t.save("mybox.json"); topology.Topology.load("mybox.json")
    topology.sample("8xh100-nvswitch")   # documented teaching topologies (package data)
    print(topology.format_matrix(t))     # a `topo -m` style matrix
"""

from __future__ import annotations

import json
from importlib import resources

from commlab.topology._matrix import LEGEND, format_matrix, topo_matrix
from commlab.topology._model import Edge, Link, Node, Topology
from commlab.topology._world import rank_info, world_topology
from commlab.topology.routes import ROUTES, Route, route


def discover(*, sysfs_root: str = "/") -> Topology:
    """This machine's topology: NVML when it works, else ``nvidia-smi topo -m``, else
    ``rocm-smi --showtopo`` (AMD GPUs), else the host's CPUs/NUMA nodes and NICs only."""
    from commlab.topology import _nvml, _rocm_smi, _smi, _sysfs

    if _nvml.available():
        topo = _nvml.discover_nvml()
        _sysfs.add_host(topo, sysfs_root)
        return topo
    try:
        text = _smi.run_topo_m()
    except Exception:  # no driver, or nvidia-smi failed: describe the host
        text = None
    if text:
        topo = _smi.parse_topo_m(text)
        topo.meta["topo_m"] = text
        return topo
    try:
        text = _rocm_smi.run_showtopo()
    except Exception:  # no ROCm tools either
        text = None
    if text:
        topo = _rocm_smi.parse_showtopo(text)
        topo.meta["showtopo"] = text
        _sysfs.add_host(topo, sysfs_root)
        return topo
    import platform
    import socket

    topo = Topology(name=f"{socket.gethostname()} (no NVIDIA GPU)",
                    description="no NVML and no nvidia-smi: CPUs/NUMA nodes and NICs from sysfs",
                    sources=["sysfs"], meta={"machine": platform.machine()})
    _sysfs.add_host(topo, sysfs_root)
    return topo


def samples() -> dict[str, str]:
    """Shipped topologies: name -> description."""
    out = {}
    for f in sorted(resources.files("commlab.topology").joinpath("data").iterdir()):
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


__all__ = ["Edge", "LEGEND", "Link", "Node", "ROUTES", "Route", "Topology", "discover",
           "fingerprint", "format_matrix", "rank_info", "route", "sample", "samples",
           "topo_matrix", "world_topology"]
