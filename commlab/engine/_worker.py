"""What runs inside each engine (rank): joining the world, tracing, recovery.

These functions are sent to the engines by the client (``commlab.engine._world``); they
need commlab, torch and triton; they reach the engine's IPython shell only where the
engine already imported IPython (``_shell``): this module never imports it.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from commlab.engine import _cell, _debugger


def join(rank: int, world_size: int, master: str, port: int, backend: str,
         local_rank: int, local_size: int, relay: tuple[str, int, str] | None,
         timeout: float, device: int | None = None) -> dict:
    """Become ``rank`` of a world of ``world_size`` whose rank 0 serves the bootstrap
    store on ``master:port``: environment, debugger hook, then ``commlab.init``. ``device``
    is the GPU given with ``--devices`` (else ``local_rank`` modulo the GPU count). Returns
    what the client shows in ``%dist_status``. Stack dumps and interrupts come through
    the engine's agent (``commlab.engine._proc``), which needs nothing from here."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(local_size), MASTER_ADDR=master,
                      MASTER_PORT=str(port))
    if device is None:
        os.environ.pop("COMMLAB_DEVICE", None)
    else:
        os.environ.update(COMMLAB_DEVICE=str(device))
    if relay is not None:
        _debugger.install(rank, *relay)
    comm = commlab.init(backend=backend, timeout=timeout)
    _set_user_names(comm)
    return {"rank": comm.rank, "pid": os.getpid(), "backend": comm.backend,
            "device": str(comm.device), "host": socket.gethostname(),
            "heap": comm.heap_kind, "shared_gpu": comm.shared_gpu}


def where() -> tuple[str, int]:
    """This engine's hostname and pid: the key of its agent's connection to the hub."""
    return socket.gethostname(), os.getpid()


def free_port(addr: str) -> int:
    """A free TCP port on ``addr`` (this host's address), for rank 0's bootstrap store."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def current_waits() -> list[dict]:
    """This rank's kernels blocked in cl.wait/cl.barrier now (JSON-able dicts: program,
    file:line, flag, wanted and held value), for the hang report's wait-for graph (the
    agent sends them with each stack dump)."""
    from commlab.racecheck import blocked_waits

    ip = _shell()
    return blocked_waits(ip.user_ns if ip is not None else None)


def _set_user_names(comm) -> None:
    """The names every cell can use without importing: commlab, torch, triton, tl, cl, comm,
    rank, world_size."""
    ip = _shell()
    if ip is None:
        return
    ip.user_ns.update(commlab=commlab, torch=torch, triton=triton, tl=tl, cl=cl, comm=comm,
                      rank=comm.rank, world_size=comm.world_size)
    _cell.install(ip)  # each cell's collectives are checked before the cell returns


def _shell():
    """The engine's IPython shell; None in a process that has not imported IPython (this
    module never imports it: a rank outside an ipyparallel engine stays without it)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def leave() -> int:
    """Close this rank's communicator (before a resize re-joins with a new world)."""
    commlab.finalize()
    return os.getpid()


def recover() -> None:
    """All ranks call this after an interrupted collective (Ctrl-C, hang report)."""
    commlab.get_communicator().recover()


def trace_start() -> None:
    commlab.trace.start()


def trace_stop() -> list[dict]:
    spans = [s.to_dict() for s in commlab.trace.stop()]
    rank = commlab.get_communicator().rank
    for s in spans:
        s.setdefault("rank", rank)
    return spans


def push(ns: dict) -> None:
    _shell().user_ns.update(ns)


def pull(name: str):
    ns = _shell().user_ns
    if name not in ns:
        raise NameError(f"name {name!r} is not defined on this rank")
    return ns[name]


def ping() -> int:
    return os.getpid()


def python_version() -> str:
    return sys.version.split()[0]
