"""``with commlab.racecheck(): ...``: a happens-before race detector and a wait-for graph
for kernels on the CPU backend.

Every kernel launched inside (commlab's and the user's) has its loads, stores and
atomics on symmetric memory recorded with vector clocks: one component per rank and
program instance, merged by ``cl.notify``/``cl.wait``/``cl.barrier`` (release and
acquire atomics) and by commlab's host-side synchronisation (every agreement, so
``commlab.barrier()`` and every collective call). Two conflicting accesses that
happens-before does not order raise ``DataRaceError`` when the launch returns;
``wait_timeout=S`` turns a wait unsatisfied for S seconds into ``WaitTimeoutError``
with the wait-for graph. Detection depends on the ordering the program establishes,
not on timing. Programs of one launch run as on a GPU, concurrently (cooperative
threads, ``commlab._interpreter.programs``); ``shuffle=True`` varies their order and
interleaving from ``seed``, so order-dependent deadlocks and lost updates surface, and
the seed in a report replays its schedule. Modules: ``_state`` (clocks, accesses,
signals), ``_races`` (conflicts, messages), ``_waits`` (timeouts, graph), ``_clock``,
``_log`` (shared logs), ``_where`` (names in messages), ``_graph`` (the wait-for graph,
also the hang report's), ``_blocked`` (this rank's blocked waits now, racecheck or not).
"""

from __future__ import annotations

import contextlib
import tempfile

import torch.distributed as dist

from commlab import runtime
from commlab._interpreter import choose, host, memory, observe, programs
from commlab.errors import CommlabUsageError, DataRaceError, WaitTimeoutError
from commlab.racecheck import _graph, _races, _where
from commlab.racecheck._blocked import blocked_waits
from commlab.racecheck._log import Shared
from commlab.racecheck._state import Checker
from commlab.racecheck._waits import Waits

_ACTIVE: list = []


def _unwrap(e: BaseException) -> BaseException:
    while e.__cause__ is not None and not isinstance(e, (WaitTimeoutError, DataRaceError)):
        e = e.__cause__
    return e


def _observers(chk: Checker, waits: Waits):
    def on_access(acc, do):
        if acc.kind in ("load", "store"):
            return chk.access(acc, do)
        return chk.atomic(acc, do)

    def on_launch(fn, grid, do):
        if chk.launch is not None:
            return do()
        chk.begin_launch(fn, grid)
        try:
            out = do()
        except Exception as e:
            inner = _unwrap(e)
            if isinstance(inner, WaitTimeoutError):
                raise inner from None
            raise
        finally:
            chk.end_launch()
        _races.refresh(chk)
        pair = _races.find(chk, chk.mine_new)
        if pair is not None:
            raise DataRaceError(_races.message(chk, *pair) + _where.schedule(chk))
        return out

    return on_access, on_launch, chk.begin_program, chk.switch, waits.event, chk.host_sync


def _install(hooks) -> None:
    on_access, on_launch, on_program, on_switch, on_wait, on_sync = hooks
    memory.set_observer(on_access)
    observe.set_launch_observer(on_launch)
    observe.set_program_observer(on_program)
    observe.set_switch_observer(on_switch)
    host.set_wait_observer(on_wait)
    runtime.SYNC_HOOK[0] = on_sync


def _remove() -> None:
    memory.set_observer(None)
    observe.set_launch_observer(None)
    observe.set_program_observer(None)
    observe.set_switch_observer(None)
    programs.configure()
    host.set_wait_observer(None)
    runtime.SYNC_HOOK[0] = None


@contextlib.contextmanager
def racecheck(wait_timeout: float | None = None, shuffle: bool = False, seed: int = 0):
    """Check every kernel launched inside for data races; with ``wait_timeout`` (seconds)
    a blocked ``cl.wait``/``cl.barrier`` raises ``WaitTimeoutError`` with the wait-for
    graph. ``shuffle=True``: each launch's programs start in an order drawn from ``seed``
    and may switch at every signal, wait and symmetric access (try a few seeds; a
    report names the one that found it). Collective: every rank enters and leaves it
    together, with the same arguments. CPU backend only."""
    if not choose.interpreting() or not memory.installed() or not observe.install():
        raise CommlabUsageError(
            "commlab.racecheck() watches kernels in Triton's interpreter: it needs the CPU "
            "backend (COMMLAB_BACKEND=cpu before `import commlab`)")
    if wait_timeout is not None and not wait_timeout > 0:
        raise CommlabUsageError(f"racecheck: wait_timeout must be > 0 seconds, got "
                                f"{wait_timeout!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise CommlabUsageError(f"racecheck: seed must be an int, got {seed!r}")
    if _ACTIVE:
        raise CommlabUsageError("racecheck: already checking; racecheck blocks do not nest")
    comm = runtime.get_communicator()
    root = [tempfile.mkdtemp(prefix="commlab-racecheck-") if comm.rank == 0 else None]
    dist.broadcast_object_list(root, src=0, group=comm.cpu_group)
    assert root[0] is not None  # broadcast from rank 0, which made the directory
    shared = Shared(root[0], comm.rank, comm.world_size)
    chk = Checker(comm, shared, wait_timeout, seed if shuffle else None)
    _install(_observers(chk, Waits(chk)))
    programs.configure(seed if shuffle else None,
                       blocked_s=min(programs.BLOCKED_S, (wait_timeout or 1.0) / 4))
    _ACTIVE.append(chk)
    try:
        yield chk
    finally:
        _remove()
        _ACTIVE.clear()
        try:
            dist.barrier(group=comm.cpu_group)
        finally:
            shared.close(remove=comm.rank == 0)


def start(wait_timeout: float | None = None, shuffle: bool = False, seed: int = 0) -> None:
    """``racecheck()`` entered until ``stop()`` (the notebook engine's ``--racecheck``)."""
    cm = racecheck(wait_timeout=wait_timeout, shuffle=shuffle, seed=seed)
    cm.__enter__()
    _OPEN.append(cm)


def stop() -> None:
    """Leave the racecheck ``start()`` entered (collective, like leaving the block)."""
    if _OPEN:
        _OPEN.pop().__exit__(None, None, None)


_OPEN: list = []

def wait_graph(nodes: list[dict], world: int) -> dict:
    """The wait-for graph of blocked waits (``blocked_waits()`` of every rank, or a
    WaitTimeoutError's ``graph``): lines, nodes, edges and any cycle."""
    return _graph.build(nodes, world)


def wait_graph_text(nodes: list[dict], world: int) -> str:
    """The wait-for graph as the hang report shows it ("" when nothing is blocked)."""
    return _graph.report(nodes, world)


__all__ = ["DataRaceError", "WaitTimeoutError", "blocked_waits", "racecheck", "start", "stop",
           "wait_graph", "wait_graph_text"]
