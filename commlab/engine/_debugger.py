"""``breakpoint()`` on a rank: a Pdb whose terminal is the notebook.

The rank's ``sys.breakpointhook`` opens a TCP connection to the client's relay
(``commlab.engine._relay``, on the world's address only), proves it knows the world's token
(HMAC-SHA256 of a nonce the relay sends), then speaks JSON lines, never pickle:

    rank -> relay   {"out": "text"}        what Pdb printed
                    {"prompt": "(Pdb) "}   Pdb waits for a line
                    {"end": true, "quit": false|true}
    relay -> rank   {"line": "next"}

It works anywhere Python runs on the rank, including a ``@triton.jit`` kernel on the CPU
backend (Triton's interpreter runs the kernel as Python).
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import io
import json
import linecache
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


def _top_lines(filename: str) -> list[int] | None:
    """First line of each top-level statement of the cell compiled as ``filename`` (IPython
    keeps its source in linecache); None when the source is not there or not Python."""
    src = "".join(linecache.getlines(filename))
    if not src:
        return None
    try:
        return [n.lineno for n in ast.parse(src).body]
    except SyntaxError:  # IPython syntax (magics, !cmd) the cell was transformed from
        return None


class RankPdb(pdb.Pdb):
    """Pdb with its stdin/stdout on the relay channel; ends the channel when done.

    IPython runs each top-level statement of a cell as its own code object, so stepping
    off one (``breakpoint()`` as the last line of an ``if`` block, or ``n`` on a
    statement's last line) would stop at its ``--Return--`` and then in IPython's own
    frames. This Pdb instead goes on to the cell's next statement, as a script's Pdb
    would; after the cell's last statement it continues."""

    def __init__(self, chan: Channel, cell_file: str | None = None):
        out = _Out(chan)
        # _In/_Out are io.TextIOBase subclasses: text file objects, as Pdb wants
        super().__init__(stdin=cast(IO[str], _In(chan, out)), stdout=cast(IO[str], out),
                         nosigint=True, skip=list(_INTERNAL))
        self.use_rawinput = False
        self.out = out  # the same object as self.stdout, typed as _Out
        self.chan: Channel | None = chan
        self.prompt = "(Pdb) "
        self.cell_file = cell_file
        self.cell_lines = _top_lines(cell_file) if cell_file else None
        self.seeking = False  # stepping on to the cell's next statement

    def _is_cell_top(self, frame) -> bool:
        return (self.cell_file is not None and frame.f_code.co_filename == self.cell_file
                and frame.f_code.co_name == "<module>")

    def stop_here(self, frame):
        if self.seeking:
            return frame.f_code.co_filename == self.cell_file
        return super().stop_here(frame)

    def user_call(self, frame, argument_list):
        if self.seeking:
            return  # its first line stops (user_line)
        super().user_call(frame, argument_list)

    def user_line(self, frame):
        self.seeking = False
        super().user_line(frame)

    def user_return(self, frame, return_value):
        if not self._is_cell_top(frame) or self.cell_lines is None:
            super().user_return(frame, return_value)
            return
        if any(ln > frame.f_lineno for ln in self.cell_lines):
            self.seeking = True  # the next statement's first line stops
            return
        super().user_return(frame, return_value)  # the cell's last statement: show it
        if self.chan is not None and not self.seeking:
            self.set_continue()  # stepping on would walk IPython's frames

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


# frames Pdb never stops in: the engine's kernel and event loop, and this relay
_INTERNAL = ("IPython.*", "ipykernel.*", "ipyparallel.*", "asyncio.*", "tornado.*", "zmq.*",
             "traitlets.*", "commlab.engine.*")


def _cell_file(frame) -> str | None:
    """The file name IPython compiled the running cell under: that of the first
    ``<module>`` frame out from ``frame`` (a kernel or function the cell called sits
    inside it), if linecache holds its source; else None."""
    while frame is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back
    if frame is None or not linecache.getlines(frame.f_code.co_filename):
        return None
    return frame.f_code.co_filename


def _hook(*args, **kwargs) -> None:
    chan = Channel(_CONFIG["host"], _CONFIG["port"], _CONFIG["token"], _CONFIG["rank"])
    frame = sys._getframe(1)
    RankPdb(chan, _cell_file(frame)).set_trace(frame)


def install(rank: int, host: str, port: int, token: str) -> None:
    _CONFIG.update(rank=rank, host=host, port=port, token=token)
    sys.breakpointhook = _hook
