"""Discovery through NVML (``import pynvml`` from nvidia-ml-py).

GPUs and their NVLinks come from NVML; GPU-GPU edges from P2P status and link counts,
because behind an NVSwitch the remote PCI id of every link reads FFFFFFFF (the link
goes to the switch, not to a GPU). PCIe path classes come from
``nvmlDeviceGetTopologyCommonAncestor``. CPUs/NUMA nodes and NICs come from sysfs
(``_sysfs``), which NVML does not describe.
"""

from __future__ import annotations

from commlab.topology._model import Edge, Link, Node, Topology

_ANCESTOR_CLASS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# Per-link data rate by NVLink version, GB/s per direction, used when NVML has no speed
# field: NVLink 4 (H100/H200) = 26.562 GB/s per link and direction (18 links = 478 GB/s).
_NVLINK_GBPS = {2: 25.0, 3: 25.0, 4: 26.562, 5: 50.0}
SOURCE = "nvml"


def available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver / library: NVMLError_LibraryNotFound and friends
        return False
    pynvml.nvmlShutdown()  # NVML counts inits; leave it as we found it
    return True


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _field(pynvml, h, field_id: int, scope: int = 0):
    """One NVML field value as a number, or None when the field is not supported."""
    try:
        v = pynvml.nvmlDeviceGetFieldValues(h, [(field_id, scope)])[0]
    except pynvml.NVMLError:
        return None
    if v.nvmlReturn != 0:
        return None
    kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
    return getattr(v.value, kind.get(v.valueType, "ullVal"))


def _links(pynvml, h) -> list[Link]:
    out = []
    for li in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(h, li)
        except pynvml.NVMLError:
            continue  # this link index does not exist on this GPU
        try:
            version = int(pynvml.nvmlDeviceGetNvLinkVersion(h, li))
        except pynvml.NVMLError:
            version = None
        try:
            remote = _s(pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, li).busId)
        except (pynvml.NVMLError, AttributeError):
            remote = ""
        mbps = _field(pynvml, h, getattr(pynvml, "NVML_FI_DEV_NVLINK_GET_SPEED", 164), li)
        speed = mbps / 1000.0 if mbps else _NVLINK_GBPS.get(version or 0, 0.0)
        out.append(Link(li, "up" if state else "down", round(speed, 3), version, remote))
    return out


def _p2p(pynvml, h1, h2) -> dict:
    caps = {"read": "NVML_P2P_CAPS_INDEX_READ", "write": "NVML_P2P_CAPS_INDEX_WRITE",
            "nvlink": "NVML_P2P_CAPS_INDEX_NVLINK", "atomics": "NVML_P2P_CAPS_INDEX_ATOMICS",
            "pci": "NVML_P2P_CAPS_INDEX_PCI"}
    names = {0: "ok", 1: "chipset not supported", 2: "GPU not supported",
             3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported"}
    out = {}
    for cap, const in caps.items():
        idx = getattr(pynvml, const)
        idx = idx[0] if isinstance(idx, tuple) else idx  # pynvml defines READ as (0,)
        try:
            out[cap] = names.get(pynvml.nvmlDeviceGetP2PStatus(h1, h2, idx), "unknown")
        except pynvml.NVMLError as e:
            out[cap] = f"error: {e}"
    return out


def discover_nvml() -> Topology:
    """GPUs, NVSwitches (inferred from switch-typed links), NVLink/PCIe edges."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return _discover(pynvml)
    finally:
        pynvml.nvmlShutdown()


def _discover(pynvml) -> Topology:
    n = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    topo = Topology(name=f"{n}x {_s(pynvml.nvmlDeviceGetName(handles[0]))}" if n else "no GPUs",
                    description="discovered through NVML", sources=["NVML (nvidia-ml-py)"],
                    meta={"driver": _s(pynvml.nvmlSystemGetDriverVersion())})
    bus_to_gpu: dict[str, str] = {}
    links: dict[str, list[Link]] = {}
    for i, h in enumerate(handles):
        bus = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
        attrs = {"pci_bus_id": bus, "uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
                 "memory_gib": round(mem / 2**30, 1), "index": i}
        try:
            attrs["numa_node"] = int(pynvml.nvmlDeviceGetNumaNodeId(h))
        except (pynvml.NVMLError, AttributeError):
            pass
        gid = f"gpu{i}"
        topo.nodes.append(Node(gid, "gpu", f"GPU{i} {_s(pynvml.nvmlDeviceGetName(h))}", attrs,
                               SOURCE))
        bus_to_gpu[_norm_bus(bus)] = gid
        links[gid] = _links(pynvml, h)
    switch_type = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    behind_switch = set()
    for i, h in enumerate(handles):
        for lk in links[f"gpu{i}"]:
            try:
                if pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, lk.index) == switch_type:
                    behind_switch.add(f"gpu{i}")
            except (pynvml.NVMLError, AttributeError):
                if lk.remote.upper().startswith("FFFFFFFF"):
                    behind_switch.add(f"gpu{i}")
    _gpu_pairs(pynvml, topo, handles, links, bus_to_gpu, behind_switch)
    if behind_switch:
        _add_switch(topo, links, behind_switch)
    return topo


def _norm_bus(bus: str) -> str:
    """NVML writes 00000000:18:00.0, sysfs 0000:18:00.0: compare the last 12 characters."""
    return bus.lower()[-12:]


def _gpu_pairs(pynvml, topo, handles, links, bus_to_gpu, behind_switch) -> None:
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            a, b = f"gpu{i}", f"gpu{j}"
            p2p = _p2p(pynvml, handles[i], handles[j])
            try:
                anc = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                pcie = _ANCESTOR_CLASS.get(int(anc), str(anc))
            except pynvml.NVMLError:
                pcie = ""
            direct = [lk for lk in links[a] if bus_to_gpu.get(_norm_bus(lk.remote)) == b]
            if direct:  # point-to-point NVLink (e.g. 2xH200 NV18): the remote id is a GPU
                up = [lk for lk in direct if lk.state == "up"]
                topo.add_edge(Edge(a, b, "nvlink", f"NV{len(up)}", direct, p2p,
                                   round(sum(lk.speed_gbps for lk in up), 3),
                                   source="nvml: NvLinkRemotePciInfo + NvLinkState + speed",
                                   attrs={"pcie_class": pcie}))
            elif a in behind_switch and b in behind_switch and p2p.get("nvlink") == "ok":
                # Behind NVSwitch: each GPU's links all go to the switches, so the pair's
                # bandwidth is bounded by the smaller per-GPU link total.
                up_a = [lk for lk in links[a] if lk.state == "up"]
                up_b = [lk for lk in links[b] if lk.state == "up"]
                peak = min(sum(lk.speed_gbps for lk in up_a), sum(lk.speed_gbps for lk in up_b))
                topo.add_edge(Edge(a, b, "nvlink", f"NV{min(len(up_a), len(up_b))}", [], p2p,
                                   round(peak, 3),
                                   source="nvml: P2PStatus(NVLINK)=ok + link counts "
                                          "(remote PCI id FFFFFFFF: behind NVSwitch)",
                                   attrs={"via": "nvswitch", "pcie_class": pcie}))
            else:
                topo.add_edge(Edge(a, b, "pcie", pcie, [], p2p, 0.0,
                                   source="nvml: TopologyCommonAncestor + P2PStatus"))


def _add_switch(topo, links, behind_switch) -> None:
    """One logical NVSwitch fabric node (NVML does not enumerate switches to a GPU host)."""
    topo.nodes.append(Node("nvswitch0", "nvswitch", "NVSwitch fabric",
                           {"note": "logical: every GPU link reports a switch as remote"},
                           "nvml: NvLinkRemoteDeviceType=SWITCH"))
    for gid in sorted(behind_switch):
        lks = links[gid]
        up = [lk for lk in lks if lk.state == "up"]
        topo.add_edge(Edge(gid, "nvswitch0", "nvlink", f"NV{len(up)}", lks, {},
                           round(sum(lk.speed_gbps for lk in up), 3),
                           source="nvml: NvLinkState + speed per link"))
