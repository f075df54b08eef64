"""Each blocked rank's Python stack, for the hang report: faulthandler on SIGUSR1, or the
rank's dump watcher (``_worker._start_dump_watcher``) when the signal brings nothing."""

from __future__ import annotations

import os
import signal
import time


def dump_stacks(world, ranks: list[int]) -> dict[int, str]:
    """rank -> its all-threads stack dump text (empty when nothing came back in 3 s)."""
    paths = {}
    for ri in world.ranks:
        if ri.rank in ranks:
            paths[ri.rank] = os.path.join(world.stack_dir, f"engine-{ri.eid}.txt")
            with open(paths[ri.rank], "w"):
                pass
    world.signal(ranks, signal.SIGUSR1)
    out: dict[int, str] = {}
    asked = False
    t0 = time.monotonic()
    while time.monotonic() < t0 + 3.0 and len(out) < len(paths):
        time.sleep(0.05)
        if not asked and time.monotonic() > t0 + 1.0:  # no signal dump: ask the watcher
            asked = True
            for r in set(paths) - set(out):
                _poke(paths[r] + ".fifo")
        for r, p in paths.items():
            text = open(p).read()
            if r not in out and text.count("File ") and _settled(p, text):
                out[r] = text
    for r, p in paths.items():
        out.setdefault(r, open(p).read())
    return out


def _poke(fifo: str) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no watcher reading
    except OSError:
        return
    try:
        os.write(fd, b"d")
    except OSError:
        pass
    finally:
        os.close(fd)


def _settled(path: str, text: str) -> bool:
    time.sleep(0.05)
    return open(path).read() == text
