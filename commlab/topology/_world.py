"""The topology of a running world: its ranks, where they run, how they reach each other.

``rank_info(comm)`` runs on every rank; ``world_topology(infos, bench)`` builds the
Topology on the client. On the CPU backend ranks are processes sharing memory: one
"rank" node each and a shared-memory edge per pair, with the bandwidth a linkbench
measured. On CUDA the host's discovered topology gets a rank -> GPU map.
"""

from __future__ import annotations

import os
import socket

import torch

from commlab.topology._discover import discover
from commlab.topology._model import Edge, Node, Topology


def rank_info(comm) -> dict:
    info = {"rank": comm.rank, "world_size": comm.world_size, "backend": comm.backend,
            "host": socket.gethostname(), "pid": os.getpid(), "device": str(comm.device)}
    try:
        info["cpus"] = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        info["cpus"] = []
    if comm.backend == "cuda":
        p = torch.cuda.get_device_properties(comm.device)
        info["pci_bus_id"] = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"  # type: ignore[attr-defined]  # torch stubs lack the pci_* properties (torch 2.13)
        info["gpu_name"] = p.name
    return info


def _cpulist(cpus: list[int]) -> str:
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def world_topology(infos: list[dict], bench=None, host: Topology | None = None) -> Topology:
    """Build the world's topology from every rank's ``rank_info`` (rank order)."""
    infos = sorted(infos, key=lambda d: d["rank"])
    w = len(infos)
    if infos[0]["backend"] == "cuda":
        return _cuda_world(infos, host)
    topo = Topology(name=f"{w} CPU ranks", description=(
        "CPU backend: each rank is a process; ranks reach each other through shared "
        "memory (the symmetric heap is one shm segment per rank, mapped by all)."),
        sources=["commlab rank_info (hostname, pid, CPU affinity)"])
    for d in infos:
        r = d["rank"]
        topo.nodes.append(Node(f"rank{r}", "rank", f"rank {r}",
                               {"host": d["host"], "pid": d["pid"],
                                "cpus": _cpulist(d.get("cpus", []))}, "rank_info"))
        topo.ranks[r] = f"rank{r}"
    for i in range(w):
        for j in range(i + 1, w):
            same = infos[i]["host"] == infos[j]["host"]
            e = Edge(f"rank{i}", f"rank{j}", "shm" if same else "net", "SHM" if same else "NET",
                     source="same host: shared memory" if same else "different hosts")
            if bench is not None:
                m = "memcpy" if "memcpy" in bench.methods else bench.methods[0]
                mat = bench.matrix(m)
                e.attrs = {f"measured {i}<-{j} GB/s": round(mat[i][j], 3),
                           f"measured {j}<-{i} GB/s": round(mat[j][i], 3),
                           "method": m, "bytes": bench.sizes[-1]}
                e.measured_gbps = round((mat[i][j] + mat[j][i]) / 2, 3)
                pk = bench.peak[i][j] if bench.peak else None
                if pk:  # a measured local copy: a reference, not the link's peak
                    e.attrs["reference GB/s (reader's local copy, measured)"] = round(pk, 3)
                e.source += f"; bandwidth: linkbench ({m}); reference: {bench.peak_source}"
            topo.add_edge(e)
    return topo


def _cuda_world(infos: list[dict], host: Topology | None) -> Topology:
    topo = host or discover()
    by_bus = {n.attrs.get("pci_bus_id", "").lower()[-12:]: n.id for n in topo.nodes_of("gpu")}
    for d in infos:
        gid = by_bus.get(d.get("pci_bus_id", "").lower()[-12:])
        if gid is None:  # ranks on another host, or no bus ids: fall back to device order
            gid = f"gpu{torch.device(d['device']).index or 0}"
        topo.ranks[d["rank"]] = gid
    return topo
