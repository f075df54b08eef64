"""The world's store, served by node 0's launcher so that it outlives every worker.

Workers are its clients (``TORCHELASTIC_USE_AGENT_STORE=true``), as under torchrun's
agent. The socket is bound to ``--master-addr`` only (127.0.0.1 on one host), never to
every interface. Nothing in the store is trusted unread: the workers MAC every value
under the world's key (``runtime/_auth.py``) and so do the launchers for their own keys
(``launcher/done/<node>``: a host's launcher has no workers left), so a stranger who
reaches the port can make a wait longer but cannot forge a value.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import torch.distributed as dist

from commlab.errors import CommlabUsageError
from commlab.runtime import _auth

_CONTEXT = "commlab.run"


def free_port(addr: str) -> int:
    """A port free on ``addr`` now (one host: the store is bound right after)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class Store:
    """Node 0: ``serve=True`` binds and serves; other nodes connect as clients."""

    def __init__(self, addr: str, port: int, world_size: int, serve: bool,
                 connect_timeout_s: float = 300.0):
        self.sock: socket.socket | None = None
        kw: dict = {}
        if serve:
            try:
                host = socket.gethostbyname(addr)
            except OSError as e:
                raise CommlabUsageError(
                    f"commlab.run: --master-addr {addr!r} does not resolve here ({e}); give "
                    f"this host's address") from None
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                self.sock.bind((host, port))
            except OSError as e:
                self.sock.close()
                raise CommlabUsageError(
                    f"commlab.run: cannot serve the store on {addr}:{port} ({e.strerror}); "
                    f"pick another --master-port, or the address of this host") from None
            self.sock.listen(512)
            kw["master_listen_fd"] = self.sock.fileno()
        self.raw = dist.TCPStore(addr, port, world_size, is_master=serve,
                                 wait_for_workers=False,
                                 timeout=timedelta(seconds=connect_timeout_s), **kw)
        self.store = _auth.authenticated(self.raw, _CONTEXT)

    def node_done(self, node: int) -> None:
        """Say that this host's launcher has no worker left (node 0 may stop serving)."""
        self.store.set(f"launcher/done/{node}", "1")

    def wait_nodes(self, nodes: list[int], limit_s: float) -> list[int]:
        """Wait up to ``limit_s`` for ``nodes``' launchers to be done; returns those that
        were not (a host cut off, or one still running)."""
        deadline = time.monotonic() + limit_s
        pending = list(nodes)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending if not self._done(n)]
            if pending:
                time.sleep(0.1)
        return pending

    def _done(self, node: int) -> bool:
        key = f"launcher/done/{node}"
        return self.store.check([key]) and self.store.get(key) == b"1"

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
