"""The topology fingerprint a tuning table is keyed by.

Fields: backend, world size, device name, GPUs per host, ranks per GPU where ranks share
one, and the GPU link structure
when it can be read (commlab.topology's fingerprint of device models and path classes
such as NV18; else the NVLink lanes up per GPU from NVML). A table measured on another
fingerprint is never used: change any field (another GPU model, a world of 4 instead of
2, a link down) and ``lookup`` falls back to the defaults until ``commlab.tune()`` runs.
The CPU backend's fingerprint has no machine-specific field (the interpreter's costs rank
the algorithms the same way on any host), so a table measured on one machine ships.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re


def _link_structure():
    """The device graph: commlab.topology's fingerprint (device models and path classes
    such as NV18) when discovery works, else NVLink lanes up per GPU from NVML, else
    None. Computed once per process: discovery takes a while and must not run per call."""
    try:
        from commlab import topology

        topo = topology.discover()
        if topo.nodes_of("gpu"):
            return {"topology": topology.fingerprint(topo)}
    except Exception:  # topology discovery is optional here
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                up = 0
                for link in range(18 * 2):
                    try:
                        up += bool(pynvml.nvmlDeviceGetNvLinkState(h, link))
                    except pynvml.NVMLError:
                        break
                out.append([f"gpu{i}", "nvlink", up])
            return {"nvlink_lanes_up": out}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML: the device name and counts still key the table
        return None


def fields(comm) -> dict:
    if comm.backend != "cuda":
        return {"backend": comm.backend, "world_size": comm.world_size, "device": "cpu"}
    groups = comm._world.placement.groups() if comm._world is not None else []
    per_gpu = max((len(g) for g in groups), default=1)
    return _cuda_fields(comm.world_size, comm.device.index or 0, per_gpu)


@functools.cache
def _cuda_fields(world_size: int, device_index: int, ranks_per_gpu: int = 1) -> dict:
    import torch

    f = {"backend": "cuda", "world_size": world_size,
         "device": torch.cuda.get_device_name(device_index),
         "gpus_per_host": torch.cuda.device_count(),
         "links": _link_structure()}
    if ranks_per_gpu > 1:  # time-sliced ranks: their timings rank algorithms differently
        f["ranks_per_gpu"] = ranks_per_gpu
    return f


def fingerprint_of(f: dict) -> str:
    """A readable, exact name: "cuda-w2-nvidia-h200-1a2b3c4d"."""
    digest = hashlib.sha256(json.dumps(f, sort_keys=True).encode()).hexdigest()[:8]
    dev = re.sub(r"[^a-z0-9]+", "-", str(f.get("device", "")).lower()).strip("-")
    return f"{f['backend']}-w{f['world_size']}-{dev}-{digest}"
