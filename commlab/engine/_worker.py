"""What runs inside each engine (rank): joining the world, stack dumps, tracing, recovery.

These functions are sent to the engines by the client (``commlab.engine._world``); they
need commlab, torch and triton; they reach the engine's IPython shell only where the
engine already imported IPython (``_shell``): this module never imports it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
from typing import Any

import torch
import triton
import triton.language as tl

import commlab
import commlab.language as cl
from commlab.engine import _debugger

_STACK_FILE: Any = None  # kept open: faulthandler writes to its descriptor from a signal handler


def join(rank: int, world_size: int, port: int, backend: str, device: int,
         relay: tuple[str, int, str] | None, stack_path: str, timeout: float) -> dict:
    """Become ``rank`` of a world of ``world_size``: environment, stack dumps, debugger
    hook, then ``commlab.init``. Returns what the client shows in ``%dist_status``."""
    global _STACK_FILE
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(device),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if _STACK_FILE is None:
        # O_APPEND: the client truncates the file before each dump, we always write at its end
        _STACK_FILE = open(stack_path, "a")  # noqa: SIM115 (lives as long as the process)
        _arm_stack_dump()
        _start_dump_watcher(stack_path + ".fifo")
        ip = _shell()
        if ip is not None:  # re-armed before every cell: see _arm_stack_dump
            ip.events.register("pre_run_cell", _arm_stack_dump)
    if relay is not None:
        _debugger.install(rank, *relay)
    comm = commlab.init(backend=backend, timeout=timeout)
    _arm_stack_dump()
    _set_user_names(comm)
    return {"rank": comm.rank, "pid": os.getpid(), "backend": comm.backend,
            "device": str(comm.device)}


def _arm_stack_dump(*_info) -> None:
    """SIGUSR1 -> every thread's Python stack into the stack file (the hang report),
    which works even while the rank is blocked in C. Armed again after ``commlab.init``
    and before each cell, in case a library took the signal (one sigaction call). On
    CUDA worlds on 2xH200 the signal still brought nothing back, for reasons not found;
    the FIFO watcher below covers that case."""
    if _STACK_FILE is not None:
        faulthandler.register(signal.SIGUSR1, file=_STACK_FILE, all_threads=True, chain=False)


def _start_dump_watcher(fifo: str) -> None:
    """The second way to ask for a stack dump: a byte written to ``fifo`` makes a daemon
    thread here dump every thread's stack. The client uses it when SIGUSR1 brings no
    dump back (on our 2xH200 CUDA worlds it never did, even for a rank in time.sleep);
    it needs the rank's main thread to let go of the GIL, which sleeping, waiting at a
    commlab agreement or on the GPU all do."""
    try:
        os.mkfifo(fifo, 0o600)
    except FileExistsError:
        pass
    except OSError:  # no FIFOs here (unusual filesystem): SIGUSR1 alone
        return

    def watch() -> None:
        while True:
            with open(fifo, "rb", buffering=0) as f:  # blocks (GIL released) for a writer
                while b := f.read(1):
                    if b == b"w":  # the kernels' blocked waits, for the wait-for graph
                        _write_waits(fifo[: -len(".fifo")] + ".waits.json")
                        continue
                    faulthandler.dump_traceback(file=_STACK_FILE, all_threads=True)
                    _STACK_FILE.flush()

    threading.Thread(target=watch, name="commlab-stack-dump", daemon=True).start()


def current_waits() -> list[dict]:
    """This rank's kernels blocked in cl.wait/cl.barrier now (JSON-able dicts: program,
    file:line, flag, wanted and held value), for the hang report's wait-for graph."""
    from commlab.racecheck import blocked_waits

    ip = _shell()
    return blocked_waits(ip.user_ns if ip is not None else None)


def _write_waits(path: str) -> None:
    try:
        data = json.dumps(current_waits())
    except Exception as e:  # noqa: BLE001 - the report says why instead of the graph
        data = json.dumps({"error": f"{type(e).__name__}: {e}"})
    with open(path + ".tmp", "w") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _set_user_names(comm) -> None:
    """The names every cell can use without importing: commlab, torch, triton, tl, cl, comm,
    rank, world_size."""
    ip = _shell()
    if ip is None:
        return
    ip.user_ns.update(commlab=commlab, torch=torch, triton=triton, tl=tl, cl=cl, comm=comm,
                      rank=comm.rank, world_size=comm.world_size)


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
