"""The client end of the rank debugger (see ``commlab.engine._debugger``).

A thread accepts connections on the world's address (the hub's: 127.0.0.1 when every
rank runs here, else the notebook's address toward the ranks), checks each one's HMAC
over a fresh nonce, and turns JSON lines into events on a queue. Cheap to probe: at most
``MAX_PENDING`` connections wait for their handshake at once (more are closed on accept),
each for ``HELLO_TIMEOUT`` seconds, so idle strangers cost a few threads, not one each.
The cell's wait loop (on the notebook's main thread) takes the events, prints Pdb's
output labelled by rank and asks the user through the notebook's own ``input()``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import secrets
import socket
import threading

MAX_LINE = 1 << 20
MAX_PENDING = 8  # handshakes in progress at once; a rank's handshake takes milliseconds
HELLO_TIMEOUT = 2.0  # seconds a connection may take to prove it knows the token


class Relay:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.token = secrets.token_hex(32)
        self.server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    socket.SOCK_STREAM)
        self.server.bind((host, 0))
        self.server.listen(16)
        self.host, self.port = self.server.getsockname()
        self.events: queue.Queue = queue.Queue()  # (kind, rank, payload)
        self.conns: dict[int, socket.socket] = {}
        self.active: set[int] = set()  # ranks with an open debugger session
        self.rejected = 0
        self._pending = 0  # connections not yet authenticated
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="commlab-pdb-relay").start()

    @property
    def address(self) -> tuple[str, int, str]:
        return (self.host, self.port, self.token)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                full = self._pending >= MAX_PENDING
                self._pending += not full
            if full:
                self.rejected += 1
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        rank = None
        pending = True
        try:
            nonce = secrets.token_hex(16)
            conn.settimeout(HELLO_TIMEOUT)
            conn.sendall(json.dumps({"nonce": nonce}).encode() + b"\n")
            hello = json.loads(rfile.readline(4096) or b"{}")
            want = hmac.new(self.token.encode(), nonce.encode(), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(str(hello.get("mac", "")), want):
                self.rejected += 1
                return
            with self._lock:
                self._pending -= 1
                pending = False
            conn.settimeout(None)
            rank = int(hello["rank"])
            with self._lock:
                self.conns[rank] = conn
                self.active.add(rank)
            while True:
                raw = rfile.readline(MAX_LINE)
                if not raw:
                    break
                msg = json.loads(raw)
                if "out" in msg:
                    self.events.put(("out", rank, str(msg["out"])))
                elif "prompt" in msg:
                    self.events.put(("prompt", rank, str(msg["prompt"])))
                elif msg.get("end"):
                    self.events.put(("end", rank, bool(msg.get("quit"))))
                    break
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a stranger
            pass
        finally:
            with self._lock:
                self._pending -= pending
            if rank is not None:
                with self._lock:
                    self.conns.pop(rank, None)
                    self.active.discard(rank)
            rfile.close()
            conn.close()

    def answer(self, rank: int, line: str) -> None:
        with self._lock:
            conn = self.conns.get(rank)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"line": line}).encode() + b"\n")
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self.server.close()
        with self._lock:
            for c in self.conns.values():
                try:
                    c.close()
                except OSError:
                    pass
