"""A TCP listener for peers that must prove they hold its token: the world hub's and the
debugger relay's common half.

It binds one address (the one the ranks use to reach the notebook), and each connection
first gets a fresh nonce and must answer with HMAC-SHA256(token, nonce) in a JSON line.
At most ``MAX_PENDING`` connections wait for that at once (more are closed on accept),
each for ``hello_timeout`` seconds, so idle strangers cost a few threads, not one each.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading

MAX_PENDING = 8  # handshakes in progress at once; a rank's handshake takes milliseconds


def mac(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


class TokenListener:
    """Subclasses set their own state, call ``_listen``, and serve each connection in
    ``_serve(conn)``, which starts with ``hello = self._greet(conn, rfile)``."""

    hello_timeout = 2.0

    def _listen(self, host: str, backlog: int, name: str) -> None:
        self.token = secrets.token_hex(32)
        self.server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    socket.SOCK_STREAM)
        self.server.bind((host, 0))
        self.server.listen(backlog)
        self.host, self.port = self.server.getsockname()[:2]
        self.rejected = 0
        self._pending = 0  # connections not yet authenticated
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=name).start()

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
        raise NotImplementedError

    def _greet(self, conn: socket.socket, rfile) -> dict:
        """The peer's hello line once it proved the token; ValueError (counted in
        ``rejected``) otherwise. Ends this connection's pending handshake either way."""
        try:
            nonce = secrets.token_hex(16)
            conn.settimeout(self.hello_timeout)
            conn.sendall(json.dumps({"nonce": nonce}).encode() + b"\n")
            hello = json.loads(rfile.readline(4096) or b"{}")
            if not isinstance(hello, dict) or not hmac.compare_digest(
                    str(hello.get("mac", "")), mac(self.token, nonce)):
                raise ValueError("the peer does not know the token")
            return hello
        except (OSError, ValueError, TypeError) as e:
            self.rejected += 1
            raise ValueError(f"handshake refused: {e}") from None
        finally:
            with self._lock:
                self._pending -= 1

    def _stop(self) -> None:
        self._closed = True
        self.server.close()
