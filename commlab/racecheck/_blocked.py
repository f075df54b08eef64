"""This rank's kernels blocked in ``cl.wait``/``cl.barrier`` now, as wait-for graph nodes
(``_graph``), for the hang report: with or without racecheck.

CPU backend: the interpreter's registry of blocked waits (``_interpreter.blocked``).
GPU: the wait records kernels write to pinned host memory (``runtime.wait_records``),
read with no CUDA call while the kernel spins. Each address is placed on the heap
(whose rank, which offset) and named: the symmetric tensor and index, or a variable of
``names`` (a notebook's namespace) that holds it, e.g. ``flag[1]``.
"""

from __future__ import annotations

from typing import Any

import torch

from commlab import runtime
from commlab._interpreter import blocked
from commlab.racecheck import _where
from commlab.runtime import wait_records
from commlab.runtime.heap import MAX_WORLD


def blocked_waits(names: dict | None = None) -> list[dict[str, Any]]:
    """The waits of this rank's kernels blocked now (JSON-able dicts, ``_graph`` nodes)."""
    comm = runtime.current_communicator()
    if comm is None:
        return []
    entries = blocked.current() + _device_records(comm)
    heap, me = comm.heap, comm.rank
    out = []
    for e in entries:
        owner, off = _place(heap, e["addr"])
        node = {"rank": me, "program": e["program"], "where": e.get("where", "line ?"),
                "kind": e["kind"], "flag_rank": owner, "flag_offset": off, "op": e["op"],
                "wants": e["wants"], "holds": e.get("holds"),
                "could_notify": _could(e, owner, heap, off, comm.world_size)}
        if off is not None:
            node["flag"] = _name(names, heap, off) or _where.flag(heap, off)
        if "blocked_s" in e:
            node["blocked_s"] = e["blocked_s"]
        out.append(node)
    return out


def _place(heap, addr: int) -> tuple[int, int | None]:
    for r, b in enumerate(heap.bases):
        if b <= addr < b + heap.size:
            return r, addr - b
    return -1, None


def _could(e, owner, heap, off, world) -> list[int] | None:
    return mailbox_writer(e["kind"], e["wants"], owner, heap, off)


def mailbox_writer(kind: str, wants: int, owner: int, heap, off) -> list[int] | None:
    """A barrier mailbox (program p, source s) is filled by s and emptied by its owner;
    who may notify a cl.wait flag is not known (None: ``_graph`` decides)."""
    if kind != "barrier" or off is None:
        return None
    src = ((off - heap.layout.signal_pad) // 4) % MAX_WORLD
    return [owner] if wants == 0 else [src]


def _name(names: dict | None, heap, off: int) -> str | None:
    """``var[i]``: a tensor of ``names`` on this rank's heap holding offset ``off``."""
    if not names:
        return None
    base = heap.bases[heap.rank]
    addr = base + off
    for k, v in list(names.items()):  # the cell may be adding names
        if k.startswith("_") or not isinstance(v, torch.Tensor) or not v.is_contiguous():
            continue
        start = v.data_ptr()
        if start <= addr < start + v.numel() * v.element_size():
            return f"{k}[{(addr - start) // v.element_size()}]"
    return None


def _device_records(comm) -> list[dict]:
    return wait_records.now(comm) if comm.device.type != "cpu" else []
