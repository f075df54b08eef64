"""``discover()``: this machine's topology from the best source that answers."""

from __future__ import annotations

import platform
import socket

from commlab.topology import _nvml, _rocm_smi, _smi, _sysfs
from commlab.topology._model import Topology


def discover(*, sysfs_root: str = "/") -> Topology:
    """This machine's topology: NVML when it works, else ``nvidia-smi topo -m``, else
    ``rocm-smi --showtopo`` (AMD GPUs), else the host's CPUs/NUMA nodes and NICs only."""
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
    topo = Topology(name=f"{socket.gethostname()} (no GPU found)",
                    description="no NVML, nvidia-smi or rocm-smi: CPUs, NUMA nodes, NICs (sysfs)",
                    sources=["sysfs"], meta={"machine": platform.machine()})
    _sysfs.add_host(topo, sysfs_root)
    return topo
