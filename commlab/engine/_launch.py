"""Starting and ending a world's processes through ipyparallel's local launcher, quietly.

ipyparallel logs to the notebook's stdout when it runs inside IPython ("Output for 1:",
"engine set stopped ... SIGKILL", an engine's last traceback). A world keeps those lines
in ``QuietLog.lines`` (``World.log_lines``) instead, for when something needs explaining.
Engines end by ipyparallel's own shutdown request (exit status 0); only those that do not
exit within ``SHUTDOWN_WAIT_S`` are signalled.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import deque

import psutil

from commlab.engine._pids import alive, end_pids

SHUTDOWN_WAIT_S = 5.0  # a shutdown request ends an idle CPU engine in well under 1 s
_PROC = [sys.executable, os.path.join(os.path.dirname(__file__), "_proc.py")]


class QuietLog(logging.Handler):
    """Keeps the last ``keep`` formatted records of ipyparallel's log, prints nothing."""

    def __init__(self, keep: int = 400):
        super().__init__(logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=keep)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(f"{record.levelname}: {record.getMessage()}")
        except Exception:  # a log record must never break the world
            pass


def quiet_logger(name: str) -> tuple[logging.Logger, QuietLog]:
    log = logging.getLogger(f"commlab.engine.ipyparallel.{name}")
    handler = QuietLog()
    log.handlers = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    return log, handler


def make_cluster(name: str, world_dir: str):
    """An ipyparallel ``Cluster`` on 127.0.0.1 whose processes run ``_proc.py`` (the
    controller must not import torch) and whose log stays out of the notebook. Its profile
    (the connection files, with the controller's key) lives in ``world_dir``, which every
    process of the world removes when the kernel that started it dies."""
    import ipyparallel as ipp
    from traitlets.config import Config

    cfg = Config()
    cleanup = ["--remove-when-orphaned", world_dir]
    cfg.LocalControllerLauncher.controller_cmd = _PROC + ["controller", *cleanup]
    cfg.LocalEngineSetLauncher.engine_cmd = _PROC + ["engine", *cleanup]
    cfg.LocalEngineLauncher.engine_cmd = _PROC + ["engine", *cleanup]
    log, handler = quiet_logger(name)
    cluster = ipp.Cluster(config=cfg, n=0, controller_ip="127.0.0.1",
                          engines=_engine_set_launcher(), log=log,
                          profile_dir=os.path.join(world_dir, "ipython"), log_level=logging.INFO,
                          shutdown_atexit=True)
    return cluster, handler


def end_engines(client, eids: list[int], pids: list[int]) -> None:
    """Ask engines ``eids`` to shut down; signal (by pid) those still alive after
    ``SHUTDOWN_WAIT_S``."""
    import time

    if client is not None and eids:
        try:
            client.shutdown(targets=eids, block=False)
        except Exception:  # an engine already gone: the pids below settle it
            pass
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    live = [p for p in pids if alive(p)]
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [p for p in live if alive(p)]
    end_pids(live, grace=1.0)


def launcher_pids(cluster) -> list[int]:
    """The controller, its scheduler processes, and every engine ``cluster`` launched."""
    pids: list[int] = []
    if cluster is None:
        return pids
    ctl = getattr(cluster.controller, "pid", None) if cluster.controller else None
    if ctl:
        pids.append(ctl)
        try:
            pids += [c.pid for c in psutil.Process(ctl).children(recursive=True)]
        except psutil.Error:
            pass
    pids += [el.pid for el in engine_launchers(cluster) if el.pid]
    return pids


def engine_launchers(cluster) -> list:
    return [el for es in (cluster.engines.values() if cluster else [])
            for el in getattr(es, "launchers", {}).values()]


class _RecordingProcess(psutil.Process):
    """A psutil.Process that remembers the exit status ``wait`` returned (ipyparallel's
    reaper thread calls it; its own record only reaches a loop we do not run)."""

    exit_code: int | None = None

    def wait(self, timeout=None):
        code = super().wait(timeout)
        self.exit_code = code
        return code


def _engine_set_launcher():
    """ipyparallel's local engine-set launcher whose reaper keeps each exit status."""
    from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher

    class EngineLauncher(LocalEngineLauncher):
        def _start_waiting(self):
            self.process = _RecordingProcess(self.pid)
            super()._start_waiting()

    class EngineSetLauncher(LocalEngineSetLauncher):
        launcher_class = EngineLauncher

    return EngineSetLauncher
