"""Run a function on a fresh world of ranks, from a test or a script.

    from commlab.testing import run_world

    def check(comm, n):
        x = torch.randn(n)
        return commlab.all_reduce(x).sum().item()

    results = run_world(check, world_size=3, args=(1000,))   # one result per rank

Ranks are *spawned* processes (never forked), each with torch.distributed's environment
set, ``commlab.init(backend)`` done, and ``fn(comm, *args)`` called. ``backend="cuda"``
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

import torch.multiprocessing as mp


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


def _rank_main(rank, world_size, port, backend, fn, args, kwargs, results, env, init=True,
               stack_file=None):
    if stack_file is not None:  # kept open: faulthandler writes from its signal handler
        _STACKS.append(open(stack_file, "w"))
        faulthandler.register(signal.SIGUSR1, file=_STACKS[-1], all_threads=True)
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if backend == "cpu":
        os.environ.setdefault("COMMLAB_BACKEND", "cpu")
    try:
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


def run_world(fn, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
              backend: str = "cpu", timeout: float = 180.0, env: dict | None = None,
              init: bool = True, store: str = "rank0", allow_killed: bool = False,
              newcomers: list | None = None) -> list:
    """Run ``fn(comm, *args, **kwargs)`` on ``world_size`` fresh ranks; return the results
    in rank order. ``fn`` must be importable (a module-level function). ``init=False``
    skips ``commlab.init`` (``comm`` is None): ``fn`` starts torch.distributed itself, as
    a script under torchrun does. ``store``: ``"rank0"`` (rank 0 serves it, as without
    torchrun) or ``"parent"`` (this process serves it; it outlives every rank).
    ``allow_killed``: a rank that dies of SIGKILL gives ``None``, not a failure.
    ``newcomers``: ``(fn, kwargs)`` per extra process, started with the ranks, that runs
    ``fn(None, **kwargs)`` without ``init`` (it calls ``commlab.init(join=True)``); their
    results follow the ranks'."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    served = None
    if store == "parent":
        served = _parent_store(port, world_size)
        env = {**(env or {}), "TORCHELASTIC_USE_AGENT_STORE": "true"}
    elif store != "rank0":
        raise ValueError(f"run_world: store must be 'rank0' or 'parent', got {store!r}")
    stacks = tempfile.TemporaryDirectory(prefix="commlab-run-world-")
    specs = [(fn, args, kwargs or {}, init)] * world_size + [
        (f, (), kw, False) for f, kw in newcomers or []]
    total = len(specs)
    stack_files = [os.path.join(stacks.name, f"rank{r}.txt") for r in range(total)]
    procs = [
        ctx.Process(target=_rank_main, daemon=True,
                    args=(r, world_size, port, backend, f, a, kw, results, env or {},
                          i, stack_files[r]))
        for r, (f, a, kw, i) in enumerate(specs)
    ]
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
