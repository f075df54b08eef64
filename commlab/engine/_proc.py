"""Entry point of the processes a world is made of: ipyparallel's controller and engines.

    python .../commlab/engine/_proc.py engine|controller [--remove-when-orphaned DIR |
                                       --remove-at-exit DIR] [ipyparallel args...]

An engine whose environment names the world's hub (``CL_ENGINE_HUB`` = host:port and
``CL_ENGINE_TOKEN``, set by the notebook for the engines it launches, not user settings)
starts its *agent* before handing over to ipyparallel: a thread that keeps one
authenticated TCP connection to the notebook's hub (``commlab.engine._hub``) and answers
its requests in JSON lines, never pickle:

    hub -> rank   {"id": 3, "op": "stacks"}            every thread's stack + waits
                  {"id": 4, "op": "signal", "sig": 2}  SIGINT: KeyboardInterrupt in main
                  {"id": 5, "op": "info"}              host, pid, rss
                  {"id": 6, "op": "exit"}              end this process now
                  {"id": 7, "op": "records", "seen": 0} call records (%dist_watch)
    rank -> hub   {"id": 3, "stacks": "...", "waits": [...]}, {"id": 4, "ok": true}, ...

When the connection ends (the notebook died, or its host is unreachable: TCP keepalive)
the agent removes DIR and ends the process: a remote engine has no parent to watch. The
controller (always on the notebook's machine) watches its parent instead and does the
same when the notebook is gone. This file imports only the standard library (and psutil,
which ipyparallel needs): the controller must not import torch.
"""

from __future__ import annotations

import atexit
import faulthandler
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

MAX_LINE = 1 << 20
CONNECT_S = 20.0  # how long a new engine tries to reach the hub before it gives up


def _end(world_dir: str) -> None:
    """The world is gone: end our children (the controller's schedulers), remove DIR, exit."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:  # never keep an orphan alive because cleanup failed
        pass
    if world_dir:
        shutil.rmtree(world_dir, ignore_errors=True)
    os._exit(0)


def _watch_parent(parent: int, world_dir: str = "", period: float = 0.5) -> None:
    while True:
        time.sleep(period)
        if os.getppid() != parent:  # orphaned: the kernel that owns this world is gone
            _end(world_dir)


def start_watchdog(world_dir: str = "") -> None:
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent, world_dir), daemon=True,
                     name="commlab-parent-watchdog").start()


# -- the engine's agent -------------------------------------------------------------------
def _mac(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


def _keepalive(sock: socket.socket) -> None:
    """A dead peer (host down, cable out) ends the connection within ~25 s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def connect_agent(address: str, token: str) -> tuple[socket.socket, object]:
    """Connect to the hub at ``host:port`` and authenticate both ways: we answer the
    hub's nonce, the hub answers ours (a stranger on the port learns nothing)."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    _keepalive(sock)
    rfile = sock.makefile("rb")
    nonce = json.loads(rfile.readline(4096) or b"{}")["nonce"]
    mine = secrets.token_hex(16)
    sock.sendall(json.dumps({"mac": _mac(token, nonce), "nonce": mine,
                             "host": socket.gethostname(), "pid": os.getpid(),
                             "addr": sock.getsockname()[0]}).encode() + b"\n")
    back = json.loads(rfile.readline(4096) or b"{}")
    if not hmac.compare_digest(str(back.get("mac", "")), _mac(token, "hub:" + mine)):
        raise ConnectionError("the hub did not prove it knows the world's token")
    sock.settimeout(None)
    return sock, rfile


def _waits() -> list:
    """The blocked waits ``commlab.engine._worker.current_waits`` lists, once the engine
    imported it (the agent itself never imports commlab)."""
    worker = sys.modules.get("commlab.engine._worker")
    try:
        return list(worker.current_waits()) if worker is not None else []
    except Exception:  # a report must come back even if the wait list cannot
        return []


def _stacks() -> str:
    with tempfile.TemporaryFile("w+") as f:  # faulthandler writes to a real descriptor
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.flush()
        f.seek(0)
        return f.read()


def _rss() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:
        return 0


def _records(seen: int, limit: int) -> dict:
    """New call records (``commlab.engine._worker.watch_records``) once the engine joined
    a world; any failure is an error reply: the agent must outlive it."""
    worker = sys.modules.get("commlab.engine._worker")
    if worker is None:
        return {"seen": 0, "records": [], "off": "this engine has not joined a world"}
    try:
        return worker.watch_records(seen, limit)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def answer(msg: dict) -> dict:
    """One hub request -> its reply (without the id)."""
    op = msg.get("op")
    if op == "stacks":
        return {"stacks": _stacks(), "waits": _waits()}
    if op == "signal":
        sig = int(msg["sig"])
        if sig == signal.SIGINT:  # KeyboardInterrupt in the main thread, wherever it waits
            signal.pthread_kill(threading.main_thread().ident or 0, sig)
        else:
            os.kill(os.getpid(), sig)
        return {"ok": True}
    if op == "info":
        return {"host": socket.gethostname(), "pid": os.getpid(), "rss": _rss()}
    if op == "records":
        return _records(int(msg.get("seen", 0)), int(msg.get("limit", 512)))
    if op == "exit":
        os._exit(int(msg.get("code", 1)))
    return {"error": f"unknown op {op!r}"}


def _serve(sock: socket.socket, rfile, world_dir: str) -> None:
    lock = threading.Lock()
    try:
        while True:
            raw = rfile.readline(MAX_LINE)
            if not raw:
                break
            msg = json.loads(raw)
            reply = {"id": msg.get("id"), **answer(msg)}
            with lock:
                sock.sendall(json.dumps(reply).encode() + b"\n")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    _end(world_dir)  # the notebook (or the way to it) is gone


def start_agent(address: str, token: str, world_dir: str) -> None:
    try:
        sock, rfile = connect_agent(address, token)
    except (OSError, ValueError, KeyError, ConnectionError) as e:
        sys.stderr.write(f"commlab engine: cannot reach the notebook's hub at {address} "
                         f"({e}); ending\n")
        _end(world_dir)
    threading.Thread(target=_serve, args=(sock, rfile, world_dir), daemon=True,
                     name="commlab-agent").start()


def main() -> None:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run as a file: don't let our siblings shadow other modules
    role, rest = sys.argv[1], sys.argv[2:]
    world_dir = ""
    if rest[:1] in (["--remove-when-orphaned"], ["--remove-at-exit"]):
        if rest[0] == "--remove-at-exit":  # a host's own copy: no other engine needs it
            atexit.register(shutil.rmtree, rest[1], True)
        world_dir, rest = rest[1], rest[2:]
    sys.argv = [sys.argv[0]] + rest
    hub = os.environ.pop("CL_ENGINE_HUB", "")
    token = os.environ.pop("CL_ENGINE_TOKEN", "")
    if role == "engine" and hub:
        start_agent(hub, token, world_dir)
    else:
        start_watchdog(world_dir)
    if role == "engine":
        from ipyparallel.engine.app import main as run
    elif role == "controller":
        from ipyparallel.controller.app import main as run
    else:
        raise SystemExit(f"commlab.engine._proc: role must be 'engine' or 'controller', "
                         f"got {role!r}")
    try:
        run()
    except RuntimeError as e:
        # an engine asked to shut down stops its event loop under tornado's run_sync,
        # which reports that as this error: it is the clean end, exit 0 without a traceback
        if "Event loop stopped before Future completed" not in str(e):
            raise


if __name__ == "__main__":
    main()
