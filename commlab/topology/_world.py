"""The topology of a running world: its ranks, where they run, how they reach each other.

``rank_info(comm)`` runs on every rank; ``world_topology(infos, bench)`` builds the
Topology on the client; ``of_world(comm)`` does both on every rank (collective). On the
CPU backend ranks are processes sharing memory: one "rank" node each and a shared-memory
edge per pair, with the bandwidth a linkbench measured. On CUDA the host's discovered
topology gets a rank -> GPU map. A world across hosts adds one "host" node per host (the
nodes on it name it in ``attrs["host_node"]``), the NIC each host's ranks talk through
(its interface and address) and a "net" edge between every two hosts' NICs, with the
send/recv rate a linkbench measured between their ranks.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import replace

import torch
import torch.distributed as dist

from commlab.runtime import get_communicator
from commlab.topology import linkbench
from commlab.topology._discover import discover
from commlab.topology._model import Edge, Node, Topology


def rank_info(comm) -> dict:
    info = {"rank": comm.rank, "world_size": comm.world_size, "backend": comm.backend,
            "host": socket.gethostname(), "pid": os.getpid(), "device": str(comm.device),
            "hosts": comm.hosts, "local_rank": comm.local.rank, "net": _interface()}
    try:
        info["cpus"] = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        info["cpus"] = []
    if comm.backend == "cuda":
        p = torch.cuda.get_device_properties(comm.device)
        info["pci_bus_id"] = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"  # type: ignore[attr-defined]  # torch stubs lack the pci_* properties (torch 2.13)
        info["gpu_name"] = p.name
    return info


def _ipv4(ifname: str) -> str:
    """The IPv4 address of interface ``ifname`` ("" if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:  # SIOCGIFADDR: struct ifreq holds the name, then a sockaddr_in
            req = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        except OSError:
            return ""
    return socket.inet_ntoa(req[20:24])


def _interface() -> dict:
    """The interface this rank's torch.distributed traffic leaves by: the one
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME names, else the first up one with an IPv4
    address that is not loopback; its address and its link speed when the kernel knows."""
    named = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
    names = [n.strip() for n in named.split(",")] if named else sorted(
        n for _, n in socket.if_nameindex() if n != "lo")
    for name in names:
        addr = _ipv4(name)
        if addr:
            try:
                mbps = int(open(f"/sys/class/net/{name}/speed").read())
            except (OSError, ValueError):  # virtual links (veth) often refuse
                mbps = -1
            return {"ifname": name, "addr": addr, "speed_mbps": mbps,
                    "source": "GLOO/NCCL_SOCKET_IFNAME" if named else "first interface up"}
    return {}


def _cpulist(cpus: list[int]) -> str:
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def world_topology(infos: list[dict], bench=None, host=None) -> Topology:
    """Build the world's topology from every rank's ``rank_info`` (rank order). On CUDA
    ``host`` is the discovered topology of this host, or across hosts a list of each
    host's (host order), which ``of_world`` gathers."""
    infos = sorted(infos, key=lambda d: d["rank"])
    w = len(infos)
    hosts = infos[0].get("hosts", [])
    if infos[0]["backend"] == "cuda" and len(hosts) > 1 and isinstance(host, list):
        return _cuda_across(infos, host)
    if infos[0]["backend"] == "cuda":
        return _cuda_world(infos, host if isinstance(host, Topology) else None)
    host_of = {r: h for h, ranks in enumerate(hosts) for r in ranks}
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
            same = (host_of[i] == host_of[j] if host_of  # probed, or COMMLAB_HOSTS split
                    else infos[i]["host"] == infos[j]["host"])
            e = Edge(f"rank{i}", f"rank{j}", "shm" if same else "net", "SHM" if same else "NET",
                     source="same host: shared memory" if same else "different hosts")
            if bench is not None:
                _measured(e, bench, i, j)
            topo.add_edge(e)
    if len(infos[0].get("hosts", [])) > 1:
        _add_hosts(topo, infos, bench)
    return topo


def _measured(e: Edge, bench, i: int, j: int) -> None:
    m = "memcpy" if "memcpy" in bench.methods else bench.methods[0]
    mat = bench.matrix(m)
    e.attrs = {f"measured {i}←{j} GB/s": round(mat[i][j], 3),  # reader←source
               f"measured {j}←{i} GB/s": round(mat[j][i], 3),
               "method": m if e.kind == "shm" else "send/recv", "bytes": bench.sizes[-1]}
    e.measured_gbps = round((mat[i][j] + mat[j][i]) / 2, 3)
    pk = bench.peak[i][j] if bench.peak else None
    if pk:  # a measured local copy: a reference, not the link's peak
        e.attrs["reference GB/s (reader's local copy, measured)"] = round(pk, 3)
    e.source += (f"; bandwidth: linkbench ({m}); reference: {bench.peak_source}"
                 if e.kind == "shm" else "; bandwidth: linkbench (torch.distributed send/recv)")


def _add_hosts(topo: Topology, infos: list[dict], bench) -> None:
    """Host boxes, each host's NIC, and a net edge between every two hosts' NICs (the
    rank-to-rank net edges then say they go through them, ``attrs["via"]``)."""
    hosts = infos[0]["hosts"]
    host_of = {r: h for h, ranks in enumerate(hosts) for r in ranks}
    topo.name = f"{len(infos)} {infos[0]['backend'].upper()} ranks on {len(hosts)} hosts"
    for h, ranks in enumerate(hosts):
        d = infos[ranks[0]]
        net = d.get("net") or {}
        topo.nodes.append(Node(f"host{h}", "host", d["host"],
                               {"hostname": d["host"], "ranks": list(ranks)}, "rank_info"))
        label = f"{net.get('ifname', 'net')} {net.get('addr', '')}".strip()
        attrs = {"host_node": f"host{h}", "interface": True, **net}  # the world's NIC
        topo.nodes.append(Node(f"nic{h}", "nic", label, attrs, f"rank {ranks[0]}'s interface"))
        for r in ranks:
            if r in topo.ranks:  # the rank's node (CPU) or its GPU (CUDA)
                topo.node(topo.ranks[r]).attrs["host_node"] = f"host{h}"
    for e in topo.edges:
        if e.kind == "net":
            e.attrs["via"] = f"nic{host_of[int(e.a[4:])]}-nic{host_of[int(e.b[4:])]}"
    for a in range(len(hosts)):
        for b in range(a + 1, len(hosts)):
            na, nb = topo.node(f"nic{a}").attrs, topo.node(f"nic{b}").attrs
            e = Edge(f"nic{a}", f"nic{b}", "net", "NET", source="different hosts (rank_info)")
            e.attrs = {"interfaces": f"{na.get('ifname', '?')} {na.get('addr', '?')} — "
                                     f"{nb.get('ifname', '?')} {nb.get('addr', '?')}"}
            speeds = [x.get("speed_mbps", -1) for x in (na, nb)]
            if min(speeds) > 0:
                e.peak_gbps = min(speeds) / 8e3  # Mb/s -> GB/s, the slower end
                e.attrs["link speed (kernel)"] = f"{min(speeds)} Mb/s"
            if bench is not None:
                cells = [bench.matrix()[i][j] for i in hosts[a] for j in hosts[b]]
                cells += [bench.matrix()[j][i] for i in hosts[a] for j in hosts[b]]
                e.measured_gbps = round(sum(cells) / len(cells), 4)
                e.attrs["measured GB/s (send/recv, mean of the pairs)"] = e.measured_gbps
                e.attrs["bytes"] = bench.sizes[-1]
                e.source += "; bandwidth: linkbench (torch.distributed send/recv)"
            topo.add_edge(e)


def of_world(comm=None, bench: bool = True, sizes=None, iters: int | None = None) -> Topology:
    """The topology of ``comm``'s world (default: this process's), hosts included; every
    rank calls it and every rank gets it. Collective. ``bench`` also runs a linkbench
    (one size on CPU, 1 MiB, unless ``sizes``) so edges carry measured rates."""
    comm = comm or get_communicator()
    infos: list = [None] * comm.world_size
    dist.all_gather_object(infos, rank_info(comm), group=comm.cpu_group)
    host = None
    if comm.backend == "cuda" and len(comm.hosts) > 1:  # each host's first rank discovers it
        found: list = [None] * comm.world_size
        mine = discover().to_dict() if comm.local.rank == 0 else None
        dist.all_gather_object(found, mine, group=comm.cpu_group)
        host = [Topology.from_dict(found[ranks[0]]) for ranks in comm.hosts]
    result = None
    if bench and comm.backend == "cpu":
        result = linkbench.run(comm, sizes or (1 << 20,), iters or 3, ("memcpy",))
    return world_topology(infos, result, host)


def _cuda_world(infos: list[dict], host: Topology | None) -> Topology:
    topo = host or discover()
    by_bus = {n.attrs["pci_bus_id"].lower()[-12:]: n.id for n in topo.nodes_of("gpu")
              if n.attrs.get("pci_bus_id")}  # a sample without bus ids maps by index
    for d in infos:
        gid = by_bus.get(d.get("pci_bus_id", "").lower()[-12:])
        if gid is None:  # ranks on another host, or no bus ids: fall back to device order
            gid = f"gpu{torch.device(d['device']).index or 0}"
        topo.ranks[d["rank"]] = gid
    return topo


def _cuda_across(infos: list[dict], topos: list[Topology]) -> Topology:
    """Each host's discovered topology, its ids prefixed "h<host>.", its GPUs mapped to
    its ranks by PCI bus id; then the host boxes, NICs and net edges."""
    hosts = infos[0]["hosts"]
    topo = Topology(name="", description=(
        "CUDA ranks on several hosts: each host's topology as its first rank discovered "
        "it; between hosts the network through each host's interface."),
        sources=["commlab rank_info; each host's topology.discover()"])
    for h, (ranks, t) in enumerate(zip(hosts, topos, strict=True)):
        p = f"h{h}."
        sub = _cuda_world([infos[r] for r in ranks], t)
        for n in sub.nodes:
            topo.nodes.append(replace(n, id=p + n.id, attrs={**n.attrs, "host_node": f"host{h}"}))
        for e in sub.edges:
            attrs = dict(e.attrs)
            if attrs.get("via"):
                attrs["via"] = p + str(attrs["via"])
            topo.add_edge(replace(e, a=p + e.a, b=p + e.b, attrs=attrs))
        topo.ranks.update({r: p + sub.ranks[r] for r in ranks})
        topo.sources += [f"host {h}: {src}" for src in t.sources]
    _add_hosts(topo, infos, None)
    return topo
