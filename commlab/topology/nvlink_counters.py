"""Live NVLink traffic from NVML's per-link counters, painted on the topology's edges.

``nvmlDeviceGetFieldValues`` with NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX and the link
index as scope id returns cumulative KiB per link. ``NvlinkSampler`` has a reader process
(``_nvlink_reader``: NVML stays out of the notebook kernel) sample them every ``interval``
seconds and hands ``{edge key: GB/s}`` (the busier direction) to a callback — typically
``TopologyExplorer.set_rates``, which batches redraws.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from commlab.topology._nvlink_reader import RX, TX  # noqa: F401 (re-exported)


def link_map(topology) -> dict[tuple[int, int], tuple[str, str]]:
    """(gpu index, link index) -> key of the edge that link belongs to. An edge's links
    are those of the GPU end that reported them (``e.a`` when both ends are GPUs); its
    TX counts one direction and its RX the other."""
    out: dict[tuple[int, int], tuple[str, str]] = {}
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
    """Paint live NVLink GB/s: a reader process (``_nvlink_reader``) samples NVML's
    counters every ``interval`` seconds; a thread here turns each pair of samples into
    ``{edge key: GB/s}`` for ``callback``. If the reader dies, ``error`` says how."""

    def __init__(self, topology, callback, interval: float = 0.1, source: str | None = None,
                 on_error=None):
        self.links = link_map(topology)
        if not self.links:
            raise RuntimeError("NvlinkSampler: this topology has no NVLink links with link "
                               "indices (recorded without NVML?); discover() on the GPU host")
        self.callback, self.interval, self._source = callback, interval, source
        self.on_error = on_error  # called with ``error`` if the reader dies
        self.last: dict = {}
        self.error: str | None = None
        self.samples = 0
        self._proc: subprocess.Popen[str] | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="commlab-nvlink", daemon=True)

    def start(self) -> NvlinkSampler:
        cfg = {"links": sorted(self.links), "interval": self.interval, "source": self._source}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "commlab.topology._nvlink_reader", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _run(self) -> None:
        proc, prev = self._proc, None
        # start() made the reader, with all three pipes, before it started this thread
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            s = json.loads(line)
            cur = {(g, lk): (tx, rx) for g, lk, tx, rx in s["c"]}
            self.samples += 1
            if prev is not None:
                self.last = rates_from_samples(prev[1], cur, s["t"] - prev[0], self.links)
                self.callback(self.last)
            prev = (s["t"], cur)
        rc = proc.wait()
        if rc != 0 and not self._stopping:
            tail = " | ".join(proc.stderr.read().strip().splitlines()[-3:])
            self.error = (f"the NVLink counter reader (pid {proc.pid}) exited with code "
                          f"{rc}: {tail or 'no message'}; live rates stopped")
            if self.on_error is not None:
                self.on_error(self.error)

    def stop(self) -> None:
        """End the reader (by its pid, through our handle) and the thread."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                if proc.stdin is not None:
                    proc.stdin.write("stop\n")
                    proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        for f in (proc.stdout, proc.stderr) if proc is not None else ():
            if f is not None:
                f.close()
