"""Live NVLink traffic from NVML's per-link counters, painted on the topology's edges.

``nvmlDeviceGetFieldValues`` with NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX and the link
index as scope id returns cumulative KiB per link. ``NvlinkSampler`` reads them every
``interval`` seconds in a thread and hands ``{edge key: GB/s}`` (the busier direction)
to a callback — typically ``TopologyExplorer.set_rates``, which batches redraws.
"""

from __future__ import annotations

import threading
import time

TX, RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX (KiB, cumulative)


def link_map(topology) -> dict[tuple[int, int], tuple[str, str]]:
    """(gpu index, link index) -> key of the edge that link belongs to. An edge's links
    are those of the GPU end that reported them (``e.a`` when both ends are GPUs); its
    TX counts one direction and its RX the other."""
    out = {}
    for e in topology.edges:
        if e.kind != "nvlink" or not e.links:
            continue
        owner = e.a if topology.node(e.a).kind == "gpu" else e.b
        n = topology.node(owner)
        if n.kind != "gpu":
            continue
        g = int(n.attrs.get("index", owner[3:]))
        for lk in e.links:
            out.setdefault((g, lk.index), e.key)
    return out


def rates_from_samples(prev: dict, cur: dict, dt: float, links: dict) -> dict:
    """GB/s per edge key from two counter samples {(gpu, link): (tx_kib, rx_kib)}.

    Each link contributes its TX and RX rates; an edge shows its busier direction."""
    tx: dict = {}
    rx: dict = {}
    for k, (t1, r1) in cur.items():
        if k not in prev or k not in links or dt <= 0:
            continue
        t0, r0 = prev[k]
        key = links[k]
        tx[key] = tx.get(key, 0.0) + max(0, t1 - t0) * 1024 / dt / 1e9
        rx[key] = rx.get(key, 0.0) + max(0, r1 - r0) * 1024 / dt / 1e9
    return {k: max(tx.get(k, 0.0), rx.get(k, 0.0)) for k in set(tx) | set(rx)}


class NvlinkSampler:
    def __init__(self, topology, callback, interval: float = 0.1):
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self.links = link_map(topology)
        if not self.links:
            pynvml.nvmlShutdown()
            raise RuntimeError("NvlinkSampler: this topology has no NVLink links with link "
                               "indices (recorded without NVML?); discover() on the GPU host")
        self.callback, self.interval = callback, interval
        self._handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g, _ in self.links}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commlab-nvlink", daemon=True)
        self.last: dict = {}

    def sample(self) -> dict:
        out = {}
        for g, h in self._handles.items():
            ids = [lk for gg, lk in self.links if gg == g]
            fields = [(f, lk) for lk in ids for f in (TX, RX)]
            vals = self._nv.nvmlDeviceGetFieldValues(h, fields)
            for k, lk in enumerate(ids):
                t, r = vals[2 * k], vals[2 * k + 1]
                if t.nvmlReturn == 0 and r.nvmlReturn == 0:
                    out[(g, lk)] = (t.value.ullVal, r.value.ullVal)
        return out

    def _run(self) -> None:
        prev, t_prev = self.sample(), time.monotonic()
        while not self._stop.wait(self.interval):
            cur, now = self.sample(), time.monotonic()
            self.last = rates_from_samples(prev, cur, now - t_prev, self.links)
            self.callback(self.last)
            prev, t_prev = cur, now

    def start(self) -> NvlinkSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._nv.nvmlShutdown()
