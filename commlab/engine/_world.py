"""A world of ranks for the notebook: ipyparallel engines, one per rank.

The controller runs on this machine, the engines through one of ipyparallel's launchers
(``_launch.plan_launch``: local, ssh, mpi, slurm), each spawned fresh by
``commlab.engine._proc``, whose agent keeps a connection to the world's hub
(``_hub.Hub``): stacks, interrupts, liveness, and the end of every engine when the
notebook ends. Cells travel as ipyparallel's HMAC-signed zmq messages; both listen only
on the plan's address (127.0.0.1 on one machine). Each engine joins as one rank
(``_worker.join``), ranks of one host contiguous, keeping its namespace across cells.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from typing import Any

from commlab import _config
from commlab.engine import _elastic, _worker
from commlab.engine._control import RankControl, RankInfo
from commlab.engine._hub import Agent, Hub
from commlab.engine._launch import (
    LaunchPlan,
    engine_launchers,
    launcher_pids,
    make_cluster,
    plan_launch,
    remote_dir,
)
from commlab.engine._pids import end_pids
from commlab.engine._relay import Relay
from commlab.engine._report import ranks_str
from commlab.engine._wait import CellRun, wait_all
from commlab.errors import CommlabUsageError

_CURRENT: World | None = None
_LAST: dict = {}  # start_world's arguments (n follows resizes), for restart_world


def _grouped(hosts: list[str], order: list[str]) -> list[int]:
    """Positions of ``hosts`` sorted so each host's are contiguous: hosts in ``order``
    first (the --hosts order), then as first seen; stable within a host."""
    rank = {h: i for i, h in enumerate(dict.fromkeys([*order, *hosts]))}
    return sorted(range(len(hosts)), key=lambda i: rank[hosts[i]])


class World(RankControl):
    """The running world. ``size``, ``backend``, ``ranks``; ``apply`` runs a function on
    every rank; ``run_cell`` runs cell source (what ``%%distributed`` does)."""

    def __init__(self, n: int, backend: str = "auto", devices: list[int] | None = None,
                 timeout: float | None = None, plan: LaunchPlan | None = None):
        if n < 1:
            raise CommlabUsageError(f"a world needs at least 1 rank, got -n {n}")
        if backend not in ("auto", "cpu", "cuda"):
            raise CommlabUsageError(f"--backend must be auto, cpu or cuda, got {backend!r}")
        if devices is not None and len(devices) < n:
            raise CommlabUsageError(
                f"--devices names {len(devices)} devices ({devices}) for {n} ranks; "
                f"name one device per rank")
        self.requested_backend = backend
        self.devices = devices
        self.timeout = float(timeout if timeout is not None
                             else _config.get("COMMLAB_TIMEOUT"))
        self.n_wanted = n
        self.plan = plan or LaunchPlan()
        self.ranks: list[RankInfo] = []
        self.backend = "?"
        # ipyparallel's Cluster and Client, the debugger's Relay, the hub: made by start()
        self.cluster: Any = None
        self.client: Any = None
        self.relay: Any = None
        self.hub: Any = None
        self.agents: dict[int, Agent] = {}  # engine id -> its agent's connection
        self.stack_dir = ""
        self.broken = ""  # why the world cannot run cells (a rank died)
        self.closed = False
        self._log = None
        self.replaced = 0  # size of the world start_world stopped for this one
        # the local launcher's store, served here so any rank may die (_elastic)
        self.store: _elastic.NotebookStore | None = None
        self.generation = 0  # shrinks and grows so far (commlab.runtime.membership)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, progress=None) -> World:
        """Start the controller and the engines, then join them; ``progress(done, total,
        what)`` is called as each step ends (total = n + 2: controller, engines, join)."""
        self.hub = Hub(self.plan.ip)
        self.relay = Relay(self.plan.ip)
        # the world's private directory: ipyparallel's connection files
        self.stack_dir = tempfile.mkdtemp(prefix="commlab-world-")
        env = {"PYTHONUNBUFFERED": "1", **self.hub.env()}
        if self.requested_backend == "cpu":
            env["COMMLAB_BACKEND"] = "cpu"
        if self.requested_backend != "cuda":
            env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        self._engine_env = env
        if _config.get("COMMLAB_WORLD_KEY"):
            env["COMMLAB_WORLD_KEY"] = _config.get("COMMLAB_WORLD_KEY")
        self.cluster, self._log = make_cluster(os.path.basename(self.stack_dir),
                                                self.stack_dir, self.plan)
        self._progress = progress or (lambda done, total, what: None)
        atexit.register(self.stop)
        try:
            total = self.n_wanted + 2
            self.cluster.start_controller_sync()
            self.client = self.cluster.connect_client_sync()
            self._progress(1, total, "controller started")
            eids = self._start_engines(self.n_wanted, lambda k: self._progress(
                1 + k, total, f"{k} of {self.n_wanted} engines up"))
            self._join(eids)
            self._progress(total, total, "ranks joined")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_engines(self, k: int, up=None) -> list[int]:
        known = set(self.client.ids)
        # no nanny process: we signal engines by pid ourselves, and it is one process less
        self.cluster.start_engines_sync(n=k, environment=dict(self._engine_env),
                                        engine_args=["--IPEngine.enable_nanny=False"])
        deadline = time.monotonic() + 120
        seen = 0
        while len(set(self.client.ids) - known) < k:  # ids of dead engines may vanish meanwhile
            if time.monotonic() > deadline:
                raise TimeoutError(f"{k} new engines did not register within 120 s")
            time.sleep(0.05)
            now = len(set(self.client.ids) - known)
            if up is not None and now > seen:
                seen = now
                up(now)
        return sorted(set(self.client.ids) - known)[:k]

    def _join(self, eids: list[int], group: bool = True) -> None:
        """Make engines ``eids`` ranks 0..len-1 of a fresh communicator (with ``group``,
        reordered so the ranks of one host are contiguous)."""
        where = wait_all(self, [self.client[e].apply_async(_worker.where) for e in eids],
                         what="reporting their hosts", limit=120)
        for eid, (host, pid) in zip(eids, where, strict=True):
            self.agents[eid] = self.hub.agent(host, pid)
        if group:
            order = _grouped([h for h, _ in where], [h for h, _ in self.plan.hosts])
            eids, where = [eids[i] for i in order], [where[i] for i in order]
        hosts = [h for h, _ in where]
        n = len(eids)
        old_store, served = self.store, self.plan.launcher == "local"
        if served:  # the notebook serves the store: it outlives every rank
            self.store = _elastic.NotebookStore(self.plan.ip, n)
            master, port = self.store.addr, self.store.port
        else:  # rank 0 serves it on its address toward us, which the others reach
            master = self.agents[eids[0]].addr or "127.0.0.1"
            port = wait_all(self, [self.client[eids[0]].apply_async(_worker.free_port,
                                                                    master)],
                            what="choosing the store's port", limit=60)[0]
        ars = []
        for r, eid in enumerate(eids):
            local = [i for i, h in enumerate(hosts) if h == hosts[r]]
            dev = self.devices[r] if self.devices else None
            ars.append(self.client[eid].apply_async(
                _worker.join, r, n, master, port, self.requested_backend, local.index(r),
                len(local), self.relay.address, self.timeout, dev, served))
        infos = wait_all(self, ars, what="joining the world", limit=180)
        if old_store is not None:
            old_store.close()
        self.generation = infos[0].get("generation", 0)
        self.ranks = [RankInfo(i["rank"], eid, i["pid"], i["device"], i["host"],
                               i.get("heap", ""), i.get("shared_gpu", ""))
                      for i, eid in zip(infos, eids, strict=True)]
        self.backend = infos[0]["backend"]
        self.broken = ""

    def stop(self) -> None:
        """End every process of this world (engines, controller) and its files."""
        global _CURRENT
        if self.closed:
            return
        self.closed = True
        pids = [ri.pid for ri in self.ranks if self.here(ri)] + self._launcher_pids()
        if self.client is not None and self.ranks and not self.broken:
            try:  # close the communicators first (the heap's shm is unlinked at init)
                wait_all(self, [self.client[ri.eid].apply_async(_worker.leave)
                                for ri in self.ranks], what="leaving the world", limit=10)
            except Exception:
                pass
        self._end_ranks(self.ranks)
        if self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            except Exception:  # a broken engine must not stop the rest of the cleanup
                pass
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        end_pids(pids)
        if self.relay is not None:
            self.relay.close()
        if self.hub is not None:
            self.hub.close()  # an engine still running anywhere ends on this EOF
        if self.store is not None:
            self.store.close()
        if self.stack_dir:
            shutil.rmtree(self.stack_dir, ignore_errors=True)
            shutil.rmtree(remote_dir(self.stack_dir), ignore_errors=True)
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass
        if _CURRENT is self:
            _CURRENT = None

    def pids(self) -> list[int]:
        """Every process of this world: the ranks' engines, the controller and its
        schedulers."""
        return sorted(set([ri.pid for ri in self.ranks] + self._launcher_pids()))

    def _launcher_pids(self) -> list[int]:
        return launcher_pids(self.cluster)

    @property
    def log_lines(self) -> list[str]:
        """ipyparallel's log of this world (kept out of the notebook), oldest first."""
        return list(self._log.lines) if self._log is not None else []

    def resize(self, n: int) -> None:
        """Grow or shrink to ``n`` ranks: survivors keep their namespaces, re-join with the
        new size (communicator and heap rebuilt); new engines start for growth."""
        if n < 1:
            raise CommlabUsageError(f"%dist_resize: the world needs at least 1 rank, got {n}")
        if self.devices is not None and n > len(self.devices):
            raise CommlabUsageError(
                f"%dist_resize {n}: only {len(self.devices)} devices were given with "
                f"--devices {self.devices}; restart with more devices")
        if n > self.size and self.plan.launcher != "local":
            raise CommlabUsageError(
                f"%dist_resize {n}: a world started with --launcher {self.plan.launcher} "
                f"can shrink but not grow (a new engine would need a host); run "
                f"%dist_start -n {n} --launcher {self.plan.launcher} with --hosts for {n}")
        self.check_usable()
        keep = self.ranks[:n]
        hosts = list(dict.fromkeys(ri.host for ri in self.ranks))
        if len(hosts) > 1:  # every host keeps as many ranks (commlab.init needs it)
            if n % len(hosts):
                raise CommlabUsageError(
                    f"%dist_resize {n}: the world spans {len(hosts)} hosts, which must keep "
                    f"the same number of ranks each; give a multiple of {len(hosts)}")
            keep = [ri for h in hosts for ri in [r for r in self.ranks if r.host == h]
                    [:n // len(hosts)]]
        drop = [ri for ri in self.ranks if ri not in keep]
        self._rebuild(keep, drop=drop, add=max(0, n - self.size))
        if _CURRENT is self and _LAST and self.plan.launcher == "local":
            _LAST["n"] = self.size

    def _rebuild(self, keep: list[RankInfo], drop: list[RankInfo], add: int) -> None:
        if keep:
            wait_all(self, [self.client[ri.eid].apply_async(_worker.leave) for ri in keep],
                     what="leaving the old world", limit=60)
        self._drop(drop)
        new = self._start_engines(add) if add else []
        self._join([ri.eid for ri in keep] + new)

    @property
    def elastic(self) -> bool:
        """Whether a rank's death leaves the survivors a world (the store outlives ranks,
        and the cpu backend can shrink)."""
        return self.store is not None and self.backend == "cpu"

    def continue_without(self, dead: list[int]) -> str:
        """Shrink to every rank but ``dead`` (see ``_elastic``); the sentence to show."""
        return _elastic.continue_without(self, dead)

    def grow(self, n: int, state: list[str] | None = None, timeout: float = 120.0) -> list[str]:
        """Admit ``n`` new ranks in place (``commlab.grow``), handing them ``state``
        (default: rank 0's ``commlab.elastic.State`` variables); returns the names."""
        names = _elastic.grow(self, n, state, timeout)
        if _CURRENT is self and _LAST:
            _LAST["n"] = self.size
        return names

    def _drop(self, ranks: list[RankInfo]) -> None:
        if ranks:
            self._end_ranks(ranks)

    @property
    def can_replace(self) -> bool:
        """Whether a stuck rank can be started again alone (only where ranks run here:
        another launcher would not know which host to put it on)."""
        return self.plan.launcher == "local"

    def replace(self, stuck: list[int]) -> None:
        """Kill ranks ``stuck`` and start fresh engines in their place; every rank
        re-joins a new communicator (the replaced ranks' namespaces are lost)."""
        by_rank = {ri.rank: ri for ri in self.ranks}
        self.kill(stuck)
        survivors = [ri for ri in self.ranks if ri.rank not in stuck]
        if survivors:
            wait_all(self, [self.client[ri.eid].apply_async(_worker.leave)
                            for ri in survivors], what="leaving the old world", limit=60)
        new = self._start_engines(len(stuck))
        order, it = [], iter(new)
        for r in range(self.size):  # replaced ranks keep their rank numbers
            order.append(next(it) if r in stuck else by_rank[r].eid)
        self._join(order, group=False)

    # -- running --------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.closed:
            raise CommlabUsageError("this world was stopped: run %dist_start -n N")
        if self.broken:
            raise CommlabUsageError(f"{self.broken}; run %dist_restart to start it again")

    def targets(self, ranks: list[int] | None) -> list[RankInfo]:
        if ranks is None:
            return list(self.ranks)
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad:
            raise CommlabUsageError(
                f"--ranks {','.join(map(str, ranks))}: {ranks_str(bad)} not in this world "
                f"of {self.size} (ranks 0-{self.size - 1})")
        return [self.ranks[r] for r in ranks]

    def apply(self, fn, *args, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; results in rank order. Blocks; raises
        a grouped ``DistributedError`` if any rank fails."""
        self.check_usable()
        eids = [ri.eid for ri in self.ranks]
        ar = self.client.direct_view(eids).apply_async(fn, *args, **kwargs)
        return CellRun(self, ar, self.ranks).wait()

    def run_cell(self, code: str, ranks: list[int] | None = None, timeout: float | None = None,
                 grace: float | None = None, trace: bool = False) -> list[dict] | None:
        """Run cell source on ``ranks`` through each engine's IPython shell (so the source
        is registered in linecache: ``@triton.jit`` works on functions defined in it).
        With ``trace``, return the ``commlab.trace`` spans every rank recorded during the
        cell (dicts with ``rank``; ``commlab.widgets.show_timeline`` draws them)."""
        self.check_usable()
        infos = self.targets(ranks)
        view = self.client.direct_view([ri.eid for ri in infos])
        if trace:
            view.apply_sync(_worker.trace_start)
        ar = view.execute(code, silent=False, block=False)
        CellRun(self, ar, infos, timeout=timeout, grace=grace, code=code).wait()
        if trace:
            return [s for spans in view.apply_sync(_worker.trace_stop) for s in spans]
        return None

    def push(self, values: dict, ranks: list[int] | None = None) -> None:
        """Define ``values`` (name -> object, pickled) in the namespace of every rank, or
        of ``ranks``."""
        self.check_usable()
        eids = [ri.eid for ri in self.targets(ranks)]
        self.client.direct_view(eids).push(dict(values), block=True)

    def pull(self, name: str, rank: int | None = None):
        """The value of ``name`` on every rank (a list in rank order), or on ``rank``."""
        self.check_usable()
        infos = self.targets(None if rank is None else [rank])
        vals = wait_all(self, [self.client[ri.eid].apply_async(_worker.pull, name)
                               for ri in infos], what=f"pulling {name}", limit=120)
        return vals[0] if rank is not None else vals

    def exit_code(self, pid: int) -> int | None:
        """The exit status of a dead engine (negative: killed by that signal)."""
        deadline = time.monotonic() + 2.0  # the launcher's thread reaps it
        while True:
            for el in engine_launchers(self.cluster):
                proc = el.process
                if pid in (el.pid, getattr(proc, "pid", None)) and \
                        getattr(proc, "exit_code", None) is not None:
                    return proc.exit_code
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

def current_world() -> World:
    """The running world; raises a clear error when there is none."""
    if _CURRENT is None or _CURRENT.closed:
        raise CommlabUsageError("no world: run %dist_start -n N first")
    return _CURRENT


def world_or_none() -> World | None:
    """The running world, or None (for code that works with or without one)."""
    return None if _CURRENT is None or _CURRENT.closed else _CURRENT


def start_world(n: int, backend: str = "auto", devices: list[int] | None = None,
                timeout: float | None = None, progress=None, launcher: str = "local",
                hosts: str | list | None = None, ip: str | None = None) -> World:
    """Start a world of ``n`` ranks (stopping the current one) and make it current.
    ``launcher`` (local, ssh, mpi, slurm), ``hosts`` ("h0:2,h1:2" or "h0,h1") and ``ip``
    (the address ranks reach this machine on) are checked before anything stops or
    starts. ``World.replaced`` is the size of the world it stopped (0: none ran);
    ``progress`` as in ``World.start``."""
    global _CURRENT
    plan = plan_launch(n, launcher, hosts, ip)
    replaced = 0
    if _CURRENT is not None and not _CURRENT.closed:
        replaced = _CURRENT.size
        _CURRENT.stop()
    w = World(n, backend, devices, timeout, plan).start(progress)
    w.replaced = replaced
    _CURRENT = w
    _LAST.clear()
    _LAST.update(n=n, backend=backend, devices=devices, timeout=timeout, launcher=launcher,
                 hosts=hosts, ip=ip)
    return w


def stop_world() -> int:
    """Stop the running world, if any (every process ends); returns how many ranks it had."""
    if _CURRENT is None:
        return 0
    n = _CURRENT.size
    _CURRENT.stop()
    return n


def restart_world(progress=None) -> World:
    """Stop the world (if one runs) and start a fresh one like the last ``start_world``,
    with the world's current size (after a resize). Every rank's variables are lost."""
    if not _LAST:
        raise CommlabUsageError("no world was started here: run %dist_start -n N first")
    last = dict(_LAST)
    if _CURRENT is not None and last.get("launcher", "local") == "local":
        last["n"] = _CURRENT.size or last["n"]  # hosts' counts stay as --hosts gave them
    return start_world(**last, progress=progress)
