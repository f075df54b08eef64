"""Entry point of the processes a world is made of: ipyparallel's controller and engines.

    python .../commlab/engine/_proc.py engine|controller [--remove-when-orphaned DIR]
                                       [ipyparallel args...]

Before handing over to ipyparallel it starts a watchdog thread: when the notebook kernel
that launched us is gone (our parent changed, e.g. the kernel crashed or was killed), the
process removes the world's directory DIR (stack dumps, ipyparallel's connection files
holding the controller's key) and exits at once, so nothing of the world outlives the
notebook.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time


def _watch_parent(parent: int, world_dir: str = "", period: float = 0.5) -> None:
    while True:
        time.sleep(period)
        if os.getppid() != parent:  # orphaned: the kernel that owns this world is gone
            _end_children()
            if world_dir:
                shutil.rmtree(world_dir, ignore_errors=True)
            os._exit(0)


def _end_children() -> None:
    """The controller runs its schedulers as child processes: end them (by pid) first."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:  # never keep an orphan alive because cleanup failed
        pass


def start_watchdog(world_dir: str = "") -> None:
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent, world_dir), daemon=True,
                     name="commlab-parent-watchdog").start()


def main() -> None:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run as a file: don't let our siblings shadow other modules
    role, rest = sys.argv[1], sys.argv[2:]
    world_dir = ""
    if rest[:1] == ["--remove-when-orphaned"]:
        world_dir, rest = rest[1], rest[2:]
    sys.argv = [sys.argv[0]] + rest
    start_watchdog(world_dir)
    if role == "engine":
        from ipyparallel.engine.app import main as run
    elif role == "controller":
        from ipyparallel.controller.app import main as run
    else:
        raise SystemExit(f"commlab.engine._proc: role must be 'engine' or 'controller', "
                         f"got {role!r}")
    try:
        run()
    except RuntimeError as e:
        # an engine asked to shut down stops its event loop under tornado's run_sync,
        # which reports that as this error: it is the clean end, exit 0 without a traceback
        if "Event loop stopped before Future completed" not in str(e):
            raise


if __name__ == "__main__":
    main()
