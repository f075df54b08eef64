"""The spin-waits of this process that are blocked now, for the hang report.

A ``cl.wait``/``cl.barrier`` under the interpreter polls from the host only once its
first atomic failed (``host``); each failed poll calls ``poll``, which notes the time
the wait began and, once it has polled ``REGISTER_S`` seconds, registers what it waits
for (program, kernel line, address, wanted value). A wait satisfied before that costs a
dict lookup per poll and nothing at all when it never polls. ``current()`` reads the
registry from any thread (the hang report's dump) with the value each flag holds now;
a program that ends drops its entry (``forget``).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
from types import FrameType

REGISTER_S = 0.05  # a wait polled this long is registered as blocked

_SKIP = (os.sep + "triton" + os.sep, os.sep + "numpy" + os.sep,
         os.path.dirname(os.path.abspath(__file__)) + os.sep,
         os.sep + os.path.join("commlab", "racecheck") + os.sep,
         os.sep + os.path.join("commlab", "language.py"))
_POLLS: dict = {}  # thread id -> [key, since, registered]
_BLOCKED: dict = {}  # thread id -> the registered wait (a JSON-able dict)
# a notebook cell's file (ipykernel's temp file, or older IPython's input name); a
# %%distributed cell's file on a rank carries the notebook's cell number (In<n>_...,
# commlab.engine._cell)
CELL_FILE = re.compile(r"(ipykernel_\d+/(?:In(?P<cell>\d+)_)?\d+\.py|<ipython-input-[\d-]+>)")


def cell_place(filename: str, line: int) -> str | None:
    """"Cell In[n], line L" for a notebook cell whose number the file names, "line L of
    the cell" for another cell file, None for a file that is not a cell."""
    m = CELL_FILE.search(filename)
    if m is None:
        return None
    return f"Cell In[{m['cell']}], line {line}" if m["cell"] else f"line {line} of the cell"


def kernel_line() -> str:
    """``file:LINE`` of the innermost frame that is kernel code (not Triton, not the
    device language's helpers, not commlab's checkers; "Cell In[n], line L" for a
    notebook cell, ``cell_place``); the language's line if none."""
    f: FrameType | None = sys._getframe(1)
    first = None
    while f is not None:
        name = f.f_code.co_filename
        if not any(s in name for s in _SKIP) and not name.startswith("<frozen"):
            # a notebook cell: its temp file's name means nothing, its number does
            return cell_place(name, f.f_lineno) or f"{os.path.basename(name)}:{f.f_lineno}"
        if first is None and name.endswith("language.py"):
            first = f"{os.path.basename(name)}:{f.f_lineno}"
        f = f.f_back
    return first or "line ?"


def poll(addr: int, want: int, op: str, kind: str, program) -> None:
    """A failed poll of the int32 at ``addr`` (``op``: ">=" for cl.wait, "==" for the
    barrier's mailboxes) by ``program`` of the running launch."""
    t = threading.get_ident()
    key = (addr, want, op, program)
    p = _POLLS.get(t)
    now = time.monotonic()
    if p is None or p[0] != key:
        _POLLS[t] = [key, now, False]
        _BLOCKED.pop(t, None)
        return
    if p[2] or now - p[1] < REGISTER_S:
        return
    p[2] = True
    _BLOCKED[t] = {"program": program, "where": kernel_line(), "kind": kind, "addr": addr,
                   "wants": want, "op": op, "since": p[1]}


def forget() -> None:
    """The calling thread's program ended: its wait (if any) is over."""
    t = threading.get_ident()
    if _POLLS:
        _POLLS.pop(t, None)
    if _BLOCKED:
        _BLOCKED.pop(t, None)


def current() -> list[dict]:
    """The registered waits still unsatisfied, each with ``holds`` (the flag's value now)
    and ``blocked_s``; ordered by program."""
    now = time.monotonic()
    out = []
    for e in list(_BLOCKED.values()):
        held = ctypes.c_int32.from_address(e["addr"]).value
        if (held == e["wants"]) if e["op"] == "==" else (held >= e["wants"]):
            continue  # satisfied since: the program went on
        d = {k: v for k, v in e.items() if k != "since"}
        d.update(holds=held, blocked_s=round(now - e["since"], 3))
        out.append(d)
    return sorted(out, key=lambda d: str(d["program"]))
