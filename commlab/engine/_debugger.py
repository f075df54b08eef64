"""``breakpoint()`` on a rank: a Pdb whose terminal is the notebook.

The rank's ``sys.breakpointhook`` opens a TCP connection to the client's relay
(``commlab.engine._relay``, loopback only), proves it knows the world's token
(HMAC-SHA256 of a nonce the relay sends), then speaks JSON lines, never pickle:

    rank -> relay   {"out": "text"}        what Pdb printed
                    {"prompt": "(Pdb) "}   Pdb waits for a line
                    {"end": true, "quit": false|true}
    relay -> rank   {"line": "next"}

It works anywhere Python runs on the rank, including a ``@triton.jit`` kernel on the CPU
backend (Triton's interpreter runs the kernel as Python).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import pdb
import socket
import sys
from typing import IO, cast

MAX_LINE = 1 << 20


class Channel:
    def __init__(self, host: str, port: int, token: str, rank: int):
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.settimeout(None)
        self.rfile = self.sock.makefile("rb")
        nonce = self.recv()["nonce"]
        mac = hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()
        self.send({"rank": rank, "mac": mac})

    def send(self, obj: dict) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self) -> dict:
        raw = self.rfile.readline(MAX_LINE)
        if not raw:
            raise EOFError("the notebook closed the debugger connection")
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.rfile.close()
            self.sock.close()
        except OSError:
            pass


class _Out(io.TextIOBase):
    def __init__(self, chan: Channel):
        self.chan = chan
        self.buf = ""

    def write(self, s: str) -> int:
        self.buf += s
        return len(s)

    def flush(self) -> None:
        """Pdb flushes after writing its prompt; we hold the text until it reads (the
        prompt then travels as the ``prompt`` message) or the session ends."""

    def send(self) -> None:
        if self.buf:
            self.chan.send({"out": self.buf})
            self.buf = ""


class _In(io.TextIOBase):
    def __init__(self, chan: Channel, out: _Out):
        self.chan, self.out = chan, out

    # typeshed's TextIOBase.readline (str) carries its own ignore against IOBase's (bytes)
    def readline(self, size: int = -1) -> str:  # type: ignore[override]  # stub: see above
        prompt = ""
        if self.out.buf.endswith("(Pdb) "):  # Pdb wrote its prompt just before reading
            self.out.buf, prompt = self.out.buf[: -len("(Pdb) ")], "(Pdb) "
        self.out.send()
        self.chan.send({"prompt": prompt or "(Pdb) "})
        msg = self.chan.recv()
        return msg.get("line", "") + "\n"


class RankPdb(pdb.Pdb):
    """Pdb with its stdin/stdout on the relay channel; ends the channel when done."""

    def __init__(self, chan: Channel):
        out = _Out(chan)
        # _In/_Out are io.TextIOBase subclasses: text file objects, as Pdb wants
        super().__init__(stdin=cast(IO[str], _In(chan, out)), stdout=cast(IO[str], out),
                         nosigint=True)
        self.use_rawinput = False
        self.out = out  # the same object as self.stdout, typed as _Out
        self.chan: Channel | None = chan
        self.prompt = "(Pdb) "

    def _end(self, quit: bool) -> None:
        if self.chan is None:
            return
        try:
            self.out.send()
            self.chan.send({"end": True, "quit": quit})
        except OSError:
            pass
        self.chan.close()
        self.chan = None

    def set_continue(self):
        super().set_continue()
        if not self.breaks:
            self._end(quit=False)

    def set_quit(self):
        super().set_quit()
        self._end(quit=True)


_CONFIG: dict = {}


def _hook(*args, **kwargs) -> None:
    chan = Channel(_CONFIG["host"], _CONFIG["port"], _CONFIG["token"], _CONFIG["rank"])
    RankPdb(chan).set_trace(sys._getframe(1))


def install(rank: int, host: str, port: int, token: str) -> None:
    _CONFIG.update(rank=rank, host=host, port=port, token=token)
    sys.breakpointhook = _hook
