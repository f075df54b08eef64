"""Run a function on a fresh world of ranks, from a test or a script.

    from commlab.testing import run_world

    def check(comm, n):
        x = torch.randn(n)
        return commlab.all_reduce(x).sum().item()

    results = run_world(check, world_size=3, args=(1000,))   # one result per rank

Ranks are fresh processes, never forks of the caller, each with torch.distributed's
environment set, ``commlab.init(backend)`` done, and ``fn(comm, *args)`` called. CPU
ranks are forked from a server process that imported commlab once (multiprocessing's
``forkserver``: a rank starts in milliseconds instead of seconds of imports) and get the
caller's environment and working directory; GPU ranks are spawned. ``backend="cuda"``
puts rank r on GPU ``r % device_count``, so a world of any size runs on one GPU (the
ranks share it through the IPC heap). A rank that raises
makes ``run_world`` raise ``WorldError`` with every rank's traceback; a world that has
not finished within ``timeout`` seconds is killed (by pid) and reported.

Worlds that lose ranks on purpose: ``store="parent"`` serves the world's store from this
process (as torchrun's agent does: ``TORCHELASTIC_USE_AGENT_STORE=true``), so any rank,
rank 0 included, may die; ``allow_killed=True`` reports a rank that died of SIGKILL as
the result ``None`` instead of a failure.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import queue
import signal
import socket
import tempfile
import time
import traceback
from contextlib import contextmanager

import torch.multiprocessing as mp

# what the CPU ranks' fork server imports once, before any rank is forked from it
_PRELOAD = ["commlab", "commlab.testing", "torch.distributed"]
_SERVER_ENV = {"COMMLAB_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}


class WorldError(RuntimeError):
    """One or more ranks failed; ``.failures`` maps rank -> traceback text."""

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures


def free_port() -> int:
    """A free port for a world's store, below the kernel's ephemeral range: a port the
    kernel hands out (bind to 0, or any outgoing connection) can be taken again by another
    process between this check and rank 0's bind; one below that range only by another
    explicit pick."""
    import random

    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(64):
        port = random.randrange(10000, low) if low > 11000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_STACKS: list = []  # a rank's stack-dump file, open for its whole life


def _rank_main(rank, world_size, port, backend, call, results, env, init=True,
               stack_file=None, caller=None):
    if stack_file is not None:  # kept open: faulthandler writes from its signal handler
        _STACKS.append(open(stack_file, "w"))
        faulthandler.register(signal.SIGUSR1, file=_STACKS[-1], all_threads=True)
    if caller is not None:  # forked from the server: take the caller's environment and cwd
        caller_env, cwd = caller
        os.environ.clear()
        os.environ.update(caller_env)
        os.environ["TRITON_INTERPRET"] = "1"  # what the server imported commlab under
        os.chdir(cwd)
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if backend == "cpu":
        os.environ.setdefault("COMMLAB_BACKEND", "cpu")
    try:
        # unpickled after the environment is set: fn's module may import commlab, which
        # reads some settings at import
        fn, args, kwargs = pickle.loads(call)
        import commlab

        comm = commlab.init(backend=backend) if init else None
        out = fn(comm, *args, **kwargs)
        try:
            payload = pickle.dumps(out)
        except Exception as e:  # report unpicklable results plainly
            raise TypeError(f"run_world: rank {rank}'s result cannot be pickled: {e}") from e
        results.put((rank, True, payload))
        commlab.finalize()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def _parent_store(port: int, world_size: int):
    """A TCPStore served by this process on 127.0.0.1 (the world's ranks are its clients)."""
    from datetime import timedelta

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True,
                          wait_for_workers=False, timeout=timedelta(seconds=60),
                          master_listen_fd=sock.fileno())
    return store, sock


@contextmanager
def _environ(values: dict):
    """``values`` in this process's environment for the block (restored after): what a
    process started inside it imports under."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_SERVED: dict = {}  # the fork server's pid -> the import-time settings it started with


def _import_settings(env) -> dict:
    """What ``import commlab`` fixes, apart from the interpreter (checked on its own)."""
    from commlab import _config

    got = _config.read_at_import(env)
    for name in ("COMMLAB_BACKEND", "TRITON_INTERPRET"):
        got.pop(name)
    return got


def _context(backend: str, start: str, env: dict | None = None):
    """(multiprocessing context, whether ranks are forked from the CPU fork server). A world
    whose environment changes a setting read at import is spawned: the server's import
    would not see it."""
    if start not in ("auto", "spawn", "forkserver"):
        raise ValueError(f"run_world: start must be 'auto', 'spawn' or 'forkserver', got "
                         f"{start!r}")
    interp = os.environ.get("TRITON_INTERPRET", "1").lower() in ("1", "true", "on", "yes")
    if start == "forkserver" and (backend != "cpu" or not interp):
        raise ValueError("run_world: start='forkserver' serves CPU worlds only (the server "
                         f"imports commlab with Triton's interpreter on); got backend="
                         f"{backend!r}, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}"
                         "; use start='spawn'")
    if start == "spawn" or backend != "cpu" or not interp:
        return mp.get_context("spawn"), False
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    with _environ(_SERVER_ENV):  # the caller's environment plus the CPU backend's settings
        forkserver.ensure_running()
        pid = _server_pid()
        if pid not in _SERVED:  # a new server: what its import sees
            _SERVED.clear()
            _SERVED[pid] = _import_settings(os.environ)
    wanted = _import_settings({**os.environ, **(env or {})})
    if wanted != _SERVED[pid]:
        if start == "forkserver":
            differ = {k: v for k, v in wanted.items() if _SERVED[pid].get(k) != v}
            raise ValueError(f"run_world: start='forkserver' cannot give this world {differ} "
                             f"(read at import; the server imported commlab with "
                             f"{ {k: _SERVED[pid].get(k) for k in differ} }); use "
                             "start='spawn' or start='auto'")
        return mp.get_context("spawn"), False
    return ctx, True


def _server_pid() -> int | None:
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def run_world(fn, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
              backend: str = "cpu", timeout: float = 180.0, env: dict | None = None,
              init: bool = True, store: str = "rank0", allow_killed: bool = False,
              newcomers: list | None = None, start: str = "auto") -> list:
    """Run ``fn(comm, *args, **kwargs)`` on ``world_size`` fresh ranks; return the results
    in rank order. ``fn`` must be importable (a module-level function). ``init=False``
    skips ``commlab.init`` (``comm`` is None): ``fn`` starts torch.distributed itself, as
    a script under torchrun does. ``store``: ``"rank0"`` (rank 0 serves it, as without
    torchrun) or ``"parent"`` (this process serves it; it outlives every rank).
    ``allow_killed``: a rank that dies of SIGKILL gives ``None``, not a failure.
    ``newcomers``: ``(fn, kwargs)`` per extra process, started with the ranks, that runs
    ``fn(None, **kwargs)`` without ``init`` (it calls ``commlab.init(join=True)``); their
    results follow the ranks'. ``start``: ``"auto"`` forks CPU ranks from the fork server
    and spawns GPU ranks; ``"spawn"`` always spawns (a rank imports everything itself)."""
    ctx, forked = _context(backend, start, env)
    caller = (dict(os.environ), os.getcwd()) if forked else None
    results = ctx.Queue()
    port = free_port()
    served = None
    if store == "parent":
        served = _parent_store(port, world_size)
        env = {**(env or {}), "TORCHELASTIC_USE_AGENT_STORE": "true"}
    elif store != "rank0":
        raise ValueError(f"run_world: store must be 'rank0' or 'parent', got {store!r}")
    stacks = tempfile.TemporaryDirectory(prefix="commlab-run-world-")
    mine = pickle.dumps((fn, args, kwargs or {}))  # unpickled by each rank after its env
    specs = [(mine, init)] * world_size + [
        (pickle.dumps((f, (), kw)), False) for f, kw in newcomers or []]
    total = len(specs)
    stack_files = [os.path.join(stacks.name, f"rank{r}.txt") for r in range(total)]
    procs = [
        ctx.Process(target=_rank_main, daemon=True,
                    args=(r, world_size, port, backend, c, results, env or {}, i,
                          stack_files[r], caller))
        for r, (c, i) in enumerate(specs)
    ]
    # a spawned rank imports commlab (the target's module) before it runs: it starts with
    # the world's environment so that settings read at import see it
    spawn_env = {} if forked else dict(env or {})
    if not forked and backend == "cpu" and "COMMLAB_BACKEND" not in os.environ:
        spawn_env.setdefault("COMMLAB_BACKEND", "cpu")  # as the rank sets it itself
    with _environ(spawn_env):
        for p in procs:
            p.start()
    got: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < total:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, payload = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if not p.is_alive() and p.exitcode not in (0, None) and r not in got]
                for r in dead:
                    if allow_killed and procs[r].exitcode == -signal.SIGKILL:
                        got[r] = (True, pickle.dumps(None))
                        continue
                    got[r] = (False, f"rank {r} died with exit code {procs[r].exitcode}")
                dead = [r for r in dead if not got[r][0]]
                if dead:  # the others cannot finish: give them a moment to report
                    deadline = min(deadline, time.monotonic() + 10)
                continue
            got[rank] = (ok, payload)
            if not ok:  # one rank failed: give the others a moment to report, then stop
                deadline = min(deadline, time.monotonic() + 10)
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == total else 0.1)
        stuck = {r: _stack_of(p, stack_files[r]) for r, p in enumerate(procs)
                 if p.is_alive() and r not in got}
        for p in procs:
            if p.is_alive():
                p.kill()  # our own child, by pid
                p.join(5)
        stacks.cleanup()
        if served is not None:
            served[1].close()
            del served
    failures = {r: str(v) for r, (ok, v) in got.items() if not ok}
    missing = [r for r in range(total) if r not in got]
    for r in missing:
        failures[r] = f"rank {r} did not finish within {timeout:g} s (killed)"
        if stuck.get(r):
            failures[r] += f"; its threads when it was stopped:\n{stuck[r]}"
    if failures:
        text = "\n".join(f"--- rank {r} ---\n{failures[r]}" for r in sorted(failures))
        raise WorldError(f"{len(failures)} of {total} ranks failed:\n{text}", failures)
    out = []
    for r in range(total):
        payload = got[r][1]
        assert isinstance(payload, bytes)  # every rank succeeded: each sent its pickled result
        out.append(pickle.loads(payload))
    return out


def _stack_of(proc, stack_file: str) -> str:
    """A live rank's Python stacks (all threads), asked for with SIGUSR1 before it is killed."""
    try:
        os.kill(proc.pid, signal.SIGUSR1)  # our own child, by pid
    except ProcessLookupError:
        return ""
    for _ in range(30):  # the dump is written from the rank's signal handler: give it a moment
        time.sleep(0.1)
        if os.path.exists(stack_file) and os.path.getsize(stack_file) > 0:
            time.sleep(0.3)
            break
    try:
        with open(stack_file) as f:
            return f.read()
    except OSError:  # the rank never got as far as opening it
        return ""
