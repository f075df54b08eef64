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

import json
import queue
import socket

from commlab.engine._listener import TokenListener

MAX_LINE = 1 << 20
HELLO_TIMEOUT = 2.0  # seconds a connection may take to prove it knows the token


class Relay(TokenListener):
    hello_timeout = HELLO_TIMEOUT

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.events: queue.Queue = queue.Queue()  # (kind, rank, payload)
        self.conns: dict[int, socket.socket] = {}
        self.active: set[int] = set()  # ranks with an open debugger session
        self._listen(host, 16, "commlab-pdb-relay")

    @property
    def address(self) -> tuple[str, int, str]:
        return (self.host, self.port, self.token)

    def _serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        rank = None
        try:
            hello = self._greet(conn, rfile)
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
        self._stop()
        with self._lock:
            for c in self.conns.values():
                try:
                    c.close()
                except OSError:
                    pass
