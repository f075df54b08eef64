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
         timeout: float, device: int | None = None, agent_store: bool = False) -> dict:
    """Become ``rank`` of a world of ``world_size`` whose bootstrap store is served on
    ``master:port`` (by rank 0, or with ``agent_store`` by the notebook, so any rank may
    die): environment, debugger hook, then ``commlab.init``. ``device``
    is the GPU given with ``--devices`` (else ``local_rank`` modulo the GPU count). Returns
    what the client shows in ``%dist_status``. Stack dumps and interrupts come through
    the engine's agent (``commlab.engine._proc``), which needs nothing from here."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(local_size), MASTER_ADDR=master,
                      MASTER_PORT=str(port))
    if agent_store:
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "true"
    else:
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    if device is None:
        os.environ.pop("COMMLAB_DEVICE", None)
    else:
        os.environ.update(COMMLAB_DEVICE=str(device))
    if relay is not None:
        _debugger.install(rank, *relay)
    comm = commlab.init(backend=backend, timeout=timeout)
    _set_user_names(comm)
    return _info(comm)


def _info(comm) -> dict:
    members = comm.members
    return {"rank": comm.rank, "pid": os.getpid(), "backend": comm.backend,
            "device": str(comm.device), "host": socket.gethostname(),
            "heap": comm.heap_kind, "shared_gpu": comm.shared_gpu,
            "generation": members.generation if members is not None else 0}


def shrink(dead_pids: list[int]) -> dict:
    """``commlab.shrink()`` after ranks died (every survivor calls it), unless the cell
    already did (no member is one of ``dead_pids``); rebinds ``rank``, ``world_size``
    and ``comm`` in the cell namespace."""
    comm = commlab.get_communicator()
    if comm.members is None or set(dead_pids) & set(comm.members.pids):
        comm = commlab.shrink()
    _rebind(comm)
    return _info(comm)


def grow(n: int, timeout: float) -> dict:
    """``commlab.grow(n)`` on a member while ``n`` new engines ``join_running``."""
    comm = commlab.grow(n, timeout=timeout)
    _rebind(comm)
    return _info(comm)


def join_running(master: str, port: int, backend: str, local_rank: int,
                 relay: tuple[str, int, str] | None, timeout: float) -> dict:
    """Join the running world whose store the notebook serves on ``master:port``
    (``commlab.init(join=True)``: admitted by the members' ``commlab.grow``)."""
    for k in ("RANK", "WORLD_SIZE", "COMMLAB_JOIN"):
        os.environ.pop(k, None)
    os.environ.update(LOCAL_RANK=str(local_rank), MASTER_ADDR=master, MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="true")
    join: dict = {"join": True}  # commlab.init(join=True), issue 27 item 3
    comm = commlab.init(backend=backend, timeout=timeout, **join)
    if relay is not None:
        _debugger.install(comm.rank, *relay)
    _set_user_names(comm)
    return _info(comm)


def hand_over(names: list[str] | None) -> list[str]:
    """Rank 0's ``names`` (default: its ``commlab.elastic.State`` variables), pickled as
    one object graph, to every rank that lacks them, over ``commlab.broadcast`` (int32
    words); collective. Returns the names."""
    import pickle

    ns = _shell().user_ns
    comm = commlab.get_communicator()
    blob = b""
    if comm.rank == 0:
        if names is None:
            state = getattr(getattr(commlab, "elastic", None), "State", None)
            names = [k for k, v in ns.items() if state is not None and isinstance(v, state)]
        blob = pickle.dumps((names, {k: ns[k] for k in names}))
    size = int(commlab.broadcast(torch.tensor([len(blob)], dtype=torch.int32))[0])
    words = torch.zeros((size + 3) // 4, dtype=torch.int32)
    if comm.rank == 0:
        words.view(torch.uint8)[:size] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    got = commlab.broadcast(words) if size else words
    names, values = pickle.loads(got.view(torch.uint8)[:size].numpy().tobytes())
    for k, v in values.items():
        ns.setdefault(k, v)  # members keep their own objects
    return names


def missing(names: list[str]) -> list[str]:
    """Which of ``names`` this rank's namespace lacks."""
    ns = _shell().user_ns
    return [k for k in names if k not in ns]


def _rebind(comm) -> None:
    ip = _shell()
    if ip is not None:
        ip.user_ns.update(comm=comm, rank=comm.rank, world_size=comm.world_size)


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


def watch_records(seen: int, limit: int = 512) -> dict:
    """The call records this rank collected after the first ``seen`` (JSON-able dicts),
    for ``%dist_watch``; the engine's agent calls it from its thread while a cell runs."""
    from commlab.runtime import communicator, records

    comm = communicator._COMM
    book = records.book(comm) if comm is not None and not comm.closed else None
    if book is None:
        why = ("records are off (COMMLAB_RECORDS=0) or the world spans hosts"
               if comm is not None else "no communicator on this rank")
        return {"seen": 0, "records": [], "off": why}
    book.poll()
    return {"seen": book.seen, "records": [r.to_dict() for r in book.since(seen, limit)]}


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
