"""Each blocked rank's Python stack, for the hang report: faulthandler on SIGUSR1, or the
rank's dump watcher (``_worker._start_dump_watcher``) when the signal brings nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time


def dump_stacks(world, ranks: list[int], waits: dict | None = None) -> dict[int, str]:
    """rank -> its all-threads stack dump text (empty when nothing came back in 3 s).
    ``waits``: filled with rank -> its kernels' blocked waits (``_worker.current_waits``),
    which each rank's dump watcher writes next to its stack file."""
    paths = {}
    for ri in world.ranks:
        if ri.rank in ranks:
            paths[ri.rank] = os.path.join(world.stack_dir, f"engine-{ri.eid}.txt")
            with open(paths[ri.rank], "w"):
                pass
            with contextlib.suppress(FileNotFoundError):
                os.remove(paths[ri.rank] + ".waits.json")
    if waits is not None:
        for p in paths.values():
            _poke(p + ".fifo", b"w")
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
    if waits is not None:
        _read_waits(paths, waits, t0 + 3.0)
    return out


def _read_waits(paths: dict[int, str], waits: dict, deadline: float) -> None:
    while True:
        for r, p in paths.items():
            if r not in waits and os.path.exists(p + ".waits.json"):
                with open(p + ".waits.json") as f:
                    got = json.load(f)
                waits[r] = got if isinstance(got, list) else []
        if len(waits) == len(paths) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _poke(fifo: str, what: bytes = b"d") -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no watcher reading
    except OSError:
        return
    try:
        os.write(fd, what)
    except OSError:
        pass
    finally:
        os.close(fd)


def _settled(path: str, text: str) -> bool:
    time.sleep(0.05)
    return open(path).read() == text
