"""Driving the world magics from tests: a real InteractiveShell, captured output."""

from __future__ import annotations

import os

import psutil
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output


def shell() -> InteractiveShell:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "commlab")
    return ip


def cell(ip, code: str, line: str = ""):
    """Run ``%%distributed line`` with ``code``; return the captured output."""
    with capture_output() as cap:
        ip.run_cell_magic("distributed", line, code)
    return cap


def magic(ip, name: str, line: str = ""):
    with capture_output() as cap:
        value = ip.run_line_magic(name, line)
    return value, cap


def world_pids(w) -> list[int]:
    """Every process of a world: engines and the ipyparallel controller."""
    return w.pids()


def alive(pids) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def shm_leftovers(pids: list[int] | None = None) -> list[str]:
    """commlab's shared-memory segments in /dev/shm; with ``pids``, only those these
    processes made (a segment's name ends in ``-p<pid>``, ``runtime/_shm.py``): tests
    running beside this one (pytest-xdist) have segments of their own."""
    names = sorted(n for n in os.listdir("/dev/shm") if n.startswith("commlab-"))
    if pids is None:
        return names
    own = {f"p{p}" for p in pids}
    return [n for n in names if n.rsplit("-", 1)[-1] in own]
