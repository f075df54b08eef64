"""The world hub: the notebook's end of one TCP connection per engine (the rank's agent in
``commlab.engine._proc``), for what ipyparallel's queues cannot carry while a rank is busy.

Through it the notebook asks a rank for its stacks (the hang report), interrupts it
(Ctrl-C, hang recovery) and asks its host, pid and memory (``%dist_status``); the end of
a connection says the rank died (liveness without pids, so it holds for ranks on other
hosts), and the end of the notebook ends every rank (the agent exits on EOF).

The listener binds only the address the ranks use to reach the notebook (127.0.0.1 for a
world on this machine). Both ends prove they know the world's token (HMAC-SHA256 over a
nonce each side sends); messages are JSON lines, never pickle. At most ``MAX_PENDING``
connections wait for their handshake at once, each for ``HELLO_TIMEOUT`` seconds.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time

from commlab.engine._listener import TokenListener, mac

MAX_LINE = 1 << 22  # a stack dump of many threads is a few hundred KiB at most
HELLO_TIMEOUT = 5.0


class Agent:
    """One engine's connection: ``host``, ``pid``, ``addr`` (its address toward us),
    ``alive`` until the connection ends."""

    def __init__(self, sock: socket.socket, rfile, hello: dict):
        self.sock, self.rfile = sock, rfile
        self.host, self.pid = str(hello["host"]), int(hello["pid"])
        self.addr = str(hello.get("addr", ""))
        self.alive = True
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._replies: dict[int, dict] = {}
        self._events: dict[int, threading.Event] = {}

    def send(self, op: str, **args) -> int:
        mid = next(self._ids)
        with self._lock:
            self._events[mid] = threading.Event()
        try:
            with self._lock:
                self.sock.sendall(json.dumps({"id": mid, "op": op, **args}).encode() + b"\n")
        except OSError:
            self.close()
        return mid

    def result(self, mid: int, timeout: float) -> dict | None:
        ev = self._events.get(mid)
        if ev is None or not ev.wait(timeout):
            return None
        with self._lock:
            self._events.pop(mid, None)
            return self._replies.pop(mid, None)

    def read(self) -> None:
        try:
            while True:
                raw = self.rfile.readline(MAX_LINE)
                if not raw:
                    break
                msg = json.loads(raw)
                mid = int(msg.pop("id"))
                with self._lock:
                    self._replies[mid] = msg
                    ev = self._events.get(mid)
                if ev is not None:
                    ev.set()
        except (OSError, ValueError, KeyError, TypeError):
            pass
        self.close()

    def close(self) -> None:
        self.alive = False
        with self._lock:
            events = list(self._events.values())
        for ev in events:  # waiters get None: the rank is gone
            ev.set()
        try:  # shutdown: the reader's file object keeps the descriptor open past close()
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Hub(TokenListener):
    hello_timeout = HELLO_TIMEOUT

    def __init__(self, host: str = "127.0.0.1"):
        self.agents: dict[tuple[str, int], Agent] = {}
        self._listen(host, 64, "commlab-hub")

    def env(self) -> dict[str, str]:
        """What an engine needs to reach us (its launcher passes it in the environment)."""
        return {"CL_ENGINE_HUB": f"{self.host}:{self.port}", "CL_ENGINE_TOKEN": self.token}

    def _serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        try:
            hello = self._greet(conn, rfile)
            conn.sendall(json.dumps({"mac": mac(self.token, "hub:" + str(hello["nonce"]))})
                         .encode() + b"\n")
            conn.settimeout(None)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            agent = Agent(conn, rfile, hello)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a stranger
            rfile.close()
            conn.close()
            return
        with self._lock:
            self.agents[(agent.host, agent.pid)] = agent
        agent.read()

    def agent(self, host: str, pid: int, timeout: float = 30.0) -> Agent:
        """The connection of the engine ``pid`` on ``host`` (it connects as it starts)."""
        deadline = time.monotonic() + timeout
        while (host, pid) not in self.agents:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine {pid} on {host} did not connect to the "
                                   f"notebook's hub at {self.host}:{self.port} within "
                                   f"{timeout:g} s")
            time.sleep(0.02)
        return self.agents[(host, pid)]

    def ask(self, agents: list[Agent], op: str, timeout: float, **args) -> list[dict | None]:
        """Send ``op`` to every agent at once; replies in order (None: no reply in time)."""
        mids = [a.send(op, **args) for a in agents]
        deadline = time.monotonic() + timeout
        return [a.result(m, max(0.0, deadline - time.monotonic()))
                for a, m in zip(agents, mids, strict=True)]

    def close(self) -> None:
        self._stop()
        with self._lock:
            agents = list(self.agents.values())
        for a in agents:
            a.close()
