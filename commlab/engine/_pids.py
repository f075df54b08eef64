"""The world's processes by pid: alive or not, and ending them (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import time

import psutil


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def end_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` s, each pid of ours that is still alive."""
    live = [p for p in set(pids) if p and alive(p)]
    for p in live:
        try:
            os.kill(p, signal.SIGTERM if grace else signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        live = [p for p in live if alive(p)]
        time.sleep(0.05)
    for p in live:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:
        live = [p for p in live if alive(p)]
        time.sleep(0.05)
