"""Starting and ending a world's processes through ipyparallel's launchers, quietly.

``plan_launch`` checks ``%dist_start``'s ``--launcher``/``--hosts``/``--ip`` before anything
starts; ``make_cluster`` configures ipyparallel for the plan: the controller always runs
here (on the plan's address), the engines through the ``local`` (this machine), ``ssh``
(``SSHEngineSetLauncher``: connection files copied with scp), ``mpi`` (``mpirun --host``,
no mpi4py needed) or ``slurm`` (``sbatch`` + ``srun``) launcher. Every engine runs
``_proc.py``, whose agent connects to the world's hub.

ipyparallel logs to the notebook's stdout when it runs inside IPython ("Output for 1:",
"engine set stopped ... SIGKILL", an engine's last traceback). A world keeps those lines
in ``QuietLog.lines`` (``World.log_lines``) instead, for when something needs explaining.
Engines end by ipyparallel's own shutdown request (exit status 0); only those that do not
exit within ``SHUTDOWN_WAIT_S`` are signalled.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import sys
from collections import deque
from dataclasses import dataclass, field

import psutil

from commlab import _config
from commlab.engine._pids import alive, end_pids
from commlab.errors import CommlabUsageError

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


LAUNCHERS = ("local", "ssh", "mpi", "slurm")
_TOOLS = {"ssh": ("ssh", "scp"), "mpi": ("mpirun",), "slurm": ("sbatch", "srun")}


@dataclass
class LaunchPlan:
    """Where a world's engines run: ``hosts`` = [(host, ranks there)] (empty: the
    launcher decides), ``ip`` = the notebook's address the ranks reach it on."""

    launcher: str = "local"
    hosts: list[tuple[str, int]] = field(default_factory=list)
    ip: str = "127.0.0.1"

    def engines(self) -> dict[str, int]:
        return dict(self.hosts)


def parse_hosts(text: str | list | None) -> list[tuple[str, int | None]]:
    """'h0:2,h1:2' -> [('h0', 2), ('h1', 2)]; 'h0,h1' -> [('h0', None), ('h1', None)]."""
    if text is None:
        return []
    if not isinstance(text, str):
        return [(h, n) if isinstance(h, str) else (str(h), None) for h, n in text]
    out: list[tuple[str, int | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, _, count = part.partition(":")
        try:
            n = int(count) if count else None
        except ValueError:
            n = -1
        if not host or (n is not None and n < 1):
            raise CommlabUsageError(
                f"--hosts {text}: {part!r} is not HOST or HOST:RANKS with RANKS >= 1; "
                f"write e.g. --hosts node0:2,node1:2")
        out.append((host, n))
    return out


def plan_launch(n: int, launcher: str = "local", hosts=None, ip: str | None = None
                ) -> LaunchPlan:
    """Check the launch flags (raises ``CommlabUsageError``: rule, value, fix) and place
    ``n`` ranks on the hosts, ranks of one host contiguous."""
    if launcher not in LAUNCHERS:
        raise CommlabUsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got "
                                f"{launcher!r}")
    given = parse_hosts(hosts)
    if given and launcher in ("local", "slurm"):
        why = ("runs every rank on this machine" if launcher == "local" else
               "places ranks itself (give the allocation to sbatch, e.g. through "
               "SlurmEngineSetLauncher.options)")
        raise CommlabUsageError(f"--hosts {hosts} with --launcher {launcher}: the {launcher} "
                                f"launcher {why}; use --launcher ssh or mpi to name hosts")
    if launcher == "ssh" and not given:
        raise CommlabUsageError("--launcher ssh needs --hosts (e.g. --hosts node0:2,node1:2): "
                                "it starts engines on the hosts named there")
    for tool in _TOOLS.get(launcher, ()):
        if shutil.which(tool) is None:
            raise CommlabUsageError(f"--launcher {launcher} needs `{tool}` on this machine's "
                                    f"PATH, and it is not there; install it (or use "
                                    f"--launcher local)")
    placed: list[tuple[str, int]] = []
    if given and all(c is None for _, c in given):
        if n % len(given):
            raise CommlabUsageError(
                f"-n {n} over --hosts {hosts}: {n} ranks do not divide evenly over "
                f"{len(given)} hosts; give a multiple of {len(given)} or counts (HOST:RANKS)")
        placed = [(h, n // len(given)) for h, _ in given]
    elif given:
        if any(c is None for _, c in given) or sum(c or 0 for _, c in given) != n:
            raise CommlabUsageError(
                f"-n {n} with --hosts {hosts}: the counts must be given for every host and "
                f"add up to {n}; write e.g. --hosts "
                f"{given[0][0]}:{n - n // 2},{given[-1][0]}:{n // 2}")
        placed = [(h, int(c or 0)) for h, c in given]
    if len({c for _, c in placed}) > 1:
        raise CommlabUsageError(
            f"--hosts {hosts}: a world across hosts needs the same number of ranks on every "
            f"host (commlab.init checks it), got {[c for _, c in placed]}; give equal counts")
    if len({h for h, _ in placed}) != len(placed):
        raise CommlabUsageError(f"--hosts {hosts} names a host twice; name each host once "
                                f"with its count (HOST:RANKS)")
    return LaunchPlan(launcher, placed, ip or _route_address([h for h, _ in placed],
                                                               launcher))


def _route_address(hosts: list[str], launcher: str) -> str:
    """This machine's address on the way to ``hosts`` (UDP connect sends nothing): where
    the hub and the controller listen. 127.0.0.1 when every rank runs here."""
    if launcher == "local":
        return "127.0.0.1"
    found = "127.0.0.1"
    targets = hosts or [socket.gethostname()]
    for h in targets:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((h, 9))
                found = s.getsockname()[0]
        except OSError as e:
            raise CommlabUsageError(f"--hosts: cannot find a route to {h!r} ({e}); check the "
                                    f"name, or give this machine's address with --ip") from None
        if not found.startswith("127."):
            return found
    if launcher == "slurm":
        raise CommlabUsageError("--launcher slurm: pass --ip ADDR, this machine's address "
                                "the compute nodes reach it on")
    return found


def ssh_args() -> list[str]:
    return shlex.split(_config.get("COMMLAB_SSH_ARGS") or "")


def make_cluster(name: str, world_dir: str, plan: LaunchPlan | None = None):
    """An ipyparallel ``Cluster`` whose controller listens on ``plan.ip`` and whose
    processes run ``_proc.py`` (the controller must not import torch), its log kept out of
    the notebook. Its profile (the connection files, with the controller's key) lives in
    ``world_dir``; an engine on another host removes its copy (``remote_dir``) when it
    ends."""
    import ipyparallel as ipp
    from traitlets.config import Config

    plan = plan or LaunchPlan()
    cfg = Config()
    cfg.LocalControllerLauncher.controller_cmd = _PROC + ["controller", "--remove-when-orphaned",
                                                          world_dir]
    engine = _PROC + ["engine", "--remove-when-orphaned", world_dir]
    if plan.launcher == "ssh":  # each host's copy of the profile goes with its engines
        engine = _PROC + ["engine", "--remove-at-exit", remote_dir(world_dir)]
    cfg.LocalEngineSetLauncher.engine_cmd = engine
    cfg.LocalEngineLauncher.engine_cmd = engine
    if plan.launcher == "ssh":
        args = ssh_args()
        cfg.SSHEngineSetLauncher.engines = plan.engines()
        for cls in ("SSHEngineSetLauncher", "SSHEngineLauncher"):
            cfg[cls].engine_cmd = engine
            cfg[cls].remote_python = sys.executable
            cfg[cls].remote_profile_dir = os.path.join(remote_dir(world_dir), "ipython")
            cfg[cls].ssh_args = list(args)
            cfg[cls].scp_args = list(args)
    elif plan.launcher == "mpi":
        cfg.MPIEngineSetLauncher.mpi_cmd = ["mpirun"]
        cfg.MPIEngineSetLauncher.mpi_args = mpi_args(plan)
        cfg.MPIEngineSetLauncher.engine_cmd = engine
    elif plan.launcher == "slurm":
        cfg.SlurmEngineSetLauncher.engine_cmd = engine
    log, handler = quiet_logger(name)
    cluster = ipp.Cluster(config=cfg, n=0, controller_ip=plan.ip,
                          engines=_engine_set_launcher(plan.launcher), log=log,
                          profile_dir=os.path.join(world_dir, "ipython"), log_level=logging.INFO,
                          shutdown_atexit=True)
    return cluster, handler


def remote_dir(world_dir: str) -> str:
    """The world's directory on an engine's host (beside ``world_dir``: never the same
    files, also where hosts share the filesystem)."""
    return world_dir + "-remote"


# what every engine needs from the notebook's environment (mpirun forwards only these)
# (ipyparallel's connection info, with the controller's key, travels the same way)
FORWARD = ("CL_ENGINE_HUB", "CL_ENGINE_TOKEN", "IPP_CONNECTION_INFO", "IPP_CLUSTER_ID",
           "IPP_PROFILE_DIR", "COMMLAB_BACKEND", "COMMLAB_WORLD_KEY", "COMMLAB_TIMEOUT",
           "OMP_NUM_THREADS", "PYTHONUNBUFFERED")


def mpi_args(plan: LaunchPlan) -> list[str]:
    """``mpirun`` flags: ranks per host, our environment, ssh as the remote agent (with
    $COMMLAB_SSH_ARGS), root allowed (containers, CI)."""
    args: list[str] = []
    if plan.hosts:
        args += ["--host", ",".join(f"{h}:{c}" for h, c in plan.hosts)]
    for name in FORWARD:
        args += ["-x", name]
    extra = ssh_args()
    if extra:
        args += ["--mca", "plm_rsh_agent", shlex.join(["ssh", *extra])]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    return args


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
    pids += [el.pid for el in engine_launchers(cluster) if el.pid and _here(el)]
    for es in cluster.engines.values():  # mpirun: the engine set is one local process
        if not getattr(es, "launchers", None) and _here(es) and getattr(es, "pid", None):
            pids.append(es.pid)
    # a launcher whose engines all ended (ranks lost) reports pid -1
    return [p for p in pids if p > 0]


def _here(launcher) -> bool:
    """Whether ``launcher.pid`` is a process of this machine (an ssh launcher's is not)."""
    from ipyparallel.cluster.launcher import LocalProcessLauncher, SSHLauncher

    return isinstance(launcher, LocalProcessLauncher) and not isinstance(launcher, SSHLauncher)


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


def _engine_set_launcher(launcher: str = "local"):
    """ipyparallel's engine-set launcher for ``launcher``; the local one's reaper keeps
    each exit status, the MPI one starts engines without ``--mpi`` (no mpi4py needed)."""
    from ipyparallel.cluster import launcher as ipl
    from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher

    if launcher == "ssh":
        return _ssh_engine_set_launcher()
    if launcher == "slurm":
        return ipl.SlurmEngineSetLauncher
    if launcher == "mpi":
        class MPIEngineSetLauncher(ipl.MPIEngineSetLauncher):
            @property
            def program(self):
                return self.engine_cmd

        return MPIEngineSetLauncher

    class EngineLauncher(LocalEngineLauncher):
        def _start_waiting(self):
            self.process = _RecordingProcess(self.pid)
            super()._start_waiting()

    class EngineSetLauncher(LocalEngineSetLauncher):
        launcher_class = EngineLauncher

    return EngineSetLauncher


def _ssh_engine_set_launcher():
    """ipyparallel's SSH engine-set launcher (``engines = {host: count}``) whose engines
    cost one ssh and a POSIX shell per start, signal and wait: ipyparallel's own runs its
    Python on the host for each (checks, ``IPython profile create``, a poll every 60 s),
    seconds of CPU per engine. Nothing needs copying: the connection info travels in the
    environment, and the hub says when an engine ends."""
    import asyncio
    import re
    from subprocess import check_output

    from ipyparallel.cluster import launcher as ipl

    class SSHEngineLauncher(ipl.SSHEngineLauncher):
        def _sh(self, script: str, timeout: float = 60) -> str:
            return check_output([*self.ssh_cmd, *self.ssh_args, self.location, "sh -s"],
                                input=script.encode(), timeout=timeout).decode("utf8", "replace")

        def start(self, hostname=None, user=None, port=None):
            self.hostname = hostname or self.hostname
            if user is not None:
                self.user = user
            if port is not None:
                self.ssh_args = [*self.ssh_args, "-p", str(port)]
            out = self.remote_output_file
            script = [f"mkdir -p {shlex.quote(os.path.dirname(out))}",
                      *(f"export {k}={shlex.quote(str(v))}" for k, v in self.get_env().items()),
                      f"nohup {shlex.join(self.program + self.program_args)} "
                      f"> {shlex.quote(out)} 2>&1 < /dev/null &", "echo __remote_pid=$!__"]
            found = re.search(r"__remote_pid=(\d+)__", self._sh("\n".join(script)))
            if found is None:
                raise RuntimeError(f"ssh {self.location}: the engine did not start")
            self.pid = int(found.group(1))
            self.notify_start({"host": self.location, "pid": self.pid})

        def signal(self, sig):
            if self.state == "running":
                self._sh(f"kill -{int(sig)} {self.pid} 2>/dev/null; true")

        async def join(self, timeout=None):
            tenths = int(10 * (timeout if timeout is not None else 60))
            script = (f"i=0; while kill -0 {self.pid} 2>/dev/null && [ $i -lt {tenths} ]; "
                      f"do sleep 0.1; i=$((i+1)); done; kill -0 {self.pid} 2>/dev/null "
                      f"&& echo running; true")
            left = await asyncio.get_running_loop().run_in_executor(None, self._sh, script)
            if "running" in left:
                raise TimeoutError(f"engine {self.pid} on {self.location} still runs")
            self.notify_stop({"exit_code": None, "pid": self.pid,
                              "identifier": self.identifier})

        async def stop(self):
            """TERM, KILL after 5 s: one ssh (the set stops its engines concurrently)."""
            if self.state != "running":
                return
            script = (f"kill -TERM {self.pid} 2>/dev/null; i=0; while kill -0 {self.pid} "
                      f"2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; "
                      f"kill -KILL {self.pid} 2>/dev/null; true")
            await asyncio.get_running_loop().run_in_executor(None, self._sh, script)
            self.notify_stop({"exit_code": None, "pid": self.pid,
                              "identifier": self.identifier})

        def get_output(self, remove=False):
            return ""

    class SSHEngineSetLauncher(ipl.SSHEngineSetLauncher):
        launcher_class = SSHEngineLauncher

    return SSHEngineSetLauncher
