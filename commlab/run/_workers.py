"""One worker process of the launcher: its environment, its start, its end.

A worker gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*) with
``TORCHELASTIC_USE_AGENT_STORE=true``, so ``commlab.init`` is a client of the launcher's
store. A replacement also gets ``COMMLAB_JOIN=1``: its ``commlab.init`` joins the running
world (RANK and WORLD_SIZE are then ignored). Workers die with the launcher
(``PR_SET_PDEATHSIG``), so a launcher killed outright leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from commlab.errors import exit_text
from commlab.run._args import RunConfig

_PR_SET_PDEATHSIG = 1
_PRCTL: Any
try:  # resolved here: between fork and exec the child only makes the call
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the launcher still ends workers itself
    _PRCTL = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def exit_str(code: int | None) -> str:
    return exit_text(code, "still running")


@dataclass
class Worker:
    rank: int  # the rank it was started for (a replacement's own rank comes from the join)
    local_rank: int
    proc: subprocess.Popen
    replacement: bool
    started: float

    @property
    def pid(self) -> int:
        return self.proc.pid

    def name(self) -> str:
        kind = "replacement for rank" if self.replacement else "rank"
        return f"{kind} {self.rank} (local {self.local_rank}, pid {self.pid})"


def worker_env(cfg: RunConfig, port: int, local_rank: int, restarts: int,
               replacement: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COMMLAB_JOIN", None)
    rank = cfg.node_rank * cfg.nproc_per_node + local_rank
    env.update(
        RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(cfg.world_size),
        LOCAL_WORLD_SIZE=str(cfg.nproc_per_node), GROUP_RANK=str(cfg.node_rank),
        ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(cfg.world_size),
        MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="true", TORCHELASTIC_RESTART_COUNT=str(restarts),
        TORCHELASTIC_MAX_RESTARTS=str(cfg.max_restarts), TORCHELASTIC_RUN_ID="commlab.run")
    if cfg.nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: ranks share the cores
    if replacement:
        env["COMMLAB_JOIN"] = "1"
    return env


def start(cfg: RunConfig, port: int, local_rank: int, restarts: int,
          replacement: bool = False) -> Worker:
    env = worker_env(cfg, port, local_rank, restarts, replacement)
    # a session of its own: a terminal's Ctrl-C reaches the launcher, which forwards it once
    proc = subprocess.Popen([sys.executable, "-u", *cfg.command], env=env,
                            start_new_session=True, preexec_fn=_die_with_parent)
    return Worker(int(env["RANK"]), local_rank, proc, replacement, time.monotonic())


def end(workers: list[Worker], sig: int, grace_s: float) -> None:
    """Send ``sig`` to each live worker (by pid), wait up to ``grace_s``, then SIGKILL
    those still alive; every one is reaped."""
    for w in workers:
        if w.proc.poll() is None:
            try:
                os.kill(w.pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    while any(w.proc.poll() is None for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()  # our own child, by pid
            w.proc.wait(10)
