"""Many short CPU worlds from one process, for the seeded fault runs.

A spawned *zygote* imports commlab once; each world's ranks are forked from it (a fork
costs milliseconds, a spawned rank ~5 s of imports on 2 busy cores, so 30 worlds of 4
ranks fit in CI). The zygote starts no thread (checked), so forking it is safe; CPU only.
Each world's store is served by a forked process of its own that outlives every rank, as
torchrun's agent store does, so any rank may die. Every process dies with its parent
(``PR_SET_PDEATHSIG``) and is reaped here; a rank killed by SIGKILL reports ``None``.

    with Zygote(env={"COMMLAB_PEER_TIMEOUT": "0.5"}, preload=("tests.worlds.elastic",)) as z:
        results, pids = z.run(fn, 4, kwargs={...}, timeout=30)

``newcomers=[(fn, kwargs)]`` forks processes beside the ranks with the world's store in
their environment and no RANK: ``fn(None, **kwargs)`` calls ``commlab.init(join=True)``.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import pickle
import select
import signal
import socket
import tempfile
import time
import traceback

import torch.multiprocessing as mp

from commlab.testing import WorldError, free_port

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Zygote:
    """A process that imported commlab (and ``preload``) and forks worlds on request."""

    def __init__(self, env: dict | None = None, preload: tuple[str, ...] = ()):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_zygote_main, args=(child, env or {}, preload),
                                 daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(300):
            self.close()
            raise RuntimeError("Zygote: the zygote did not import commlab within 300 s")
        ok, text = self._conn.recv()
        if not ok:
            self.close()
            raise RuntimeError(f"Zygote: the zygote failed to start:\n{text}")

    def run(self, fn, world_size: int, kwargs: dict | None = None, timeout: float = 60.0,
            allow_killed: bool = True, init: bool = True,
            newcomers: tuple = ()) -> tuple[list, list[int]]:
        """``fn(comm, **kwargs)`` on ``world_size`` forked ranks (``commlab.init`` done;
        ``init=False``: not done, ``comm`` is None, as under torchrun) and each
        ``(fn, kwargs)`` of ``newcomers`` after them; returns the results in that order
        (``None`` for a process SIGKILLed when ``allow_killed``) and their pids. A failed
        or hung process raises WorldError with every failing one's text (a hung one's
        stacks included)."""
        self._conn.send((fn, world_size, kwargs or {}, timeout, init, tuple(newcomers)))
        if not self._conn.poll(timeout + 60):
            self.close()
            raise RuntimeError(f"Zygote: no report from the zygote {timeout + 60:g} s into a "
                               f"world of {world_size}")
        got, pids = self._conn.recv()
        failures = {}
        for r, (status, value) in enumerate(got):
            if status == "killed" and not allow_killed:
                failures[r] = f"process {r} was killed by SIGKILL"
            elif status not in ("ok", "killed"):
                failures[r] = value
        if failures:
            text = "\n".join(f"--- rank {r} ---\n{failures[r]}" for r in sorted(failures))
            raise WorldError(f"{len(failures)} of {len(got)} processes failed:\n{text}",
                             failures)
        return [pickle.loads(v) if s == "ok" else None for s, v in got], pids

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()  # our own child, by pid
            self._proc.join(5)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _zygote_main(conn, env: dict, preload: tuple[str, ...]) -> None:
    try:
        _die_with_parent()
        os.environ.update(env)
        os.environ.setdefault("COMMLAB_BACKEND", "cpu")
        import commlab  # noqa: F401  (before any kernel is defined)

        for name in preload:
            importlib.import_module(name)
        threads = os.listdir(f"/proc/{os.getpid()}/task")
        if len(threads) != 1:
            raise RuntimeError(f"the zygote runs {len(threads)} threads; forking it is unsafe")
    except BaseException:
        conn.send((False, traceback.format_exc()))
        return
    conn.send((True, ""))
    while True:
        request = conn.recv()
        if request is None:
            return
        conn.send(_world(conn, *request))


def _world(conn, fn, world_size: int, kwargs: dict, timeout: float, init: bool,
           newcomers: tuple) -> tuple[list, list]:
    port = free_port()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    store_r, store_w = os.pipe()
    store_pid = os.fork()
    if store_pid == 0:  # the store: serves until the zygote closes store_w
        code = 1
        try:
            _die_with_parent()
            os.close(store_w)
            from datetime import timedelta

            import torch.distributed as dist

            server = dist.TCPStore("127.0.0.1", port, world_size, is_master=True,
                                   wait_for_workers=False, timeout=timedelta(seconds=60),
                                   master_listen_fd=sock.fileno())
            os.read(store_r, 1)  # EOF: the world is over
            del server
            code = 0
        finally:
            os._exit(code)
    os.close(store_r)
    stacks = tempfile.TemporaryDirectory(prefix="commlab-zygote-")
    pids, pipes = [], []
    jobs = [(r, fn, kwargs, init) for r in range(world_size)]
    jobs += [(None, f, kw, False) for f, kw in newcomers]
    for r, (rank, f, kw, do_init) in enumerate(jobs):
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rd)
            _rank(rank, world_size, port, f, kw, do_init, wr, (sock, conn, store_w),
                  os.path.join(stacks.name, f"rank{r}.txt"))
        os.close(wr)
        pids.append(pid)
        pipes.append(rd)
    sock.close()
    data = {fd: b"" for fd in pipes}
    open_fds, deadline = set(pipes), time.monotonic() + timeout
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], 0.2)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                data[fd] += chunk
            else:
                open_fds.discard(fd)
    hung = {pipes.index(fd) for fd in open_fds}
    stuck = {r: _stack_of(pids[r], os.path.join(stacks.name, f"rank{r}.txt")) for r in hung}
    for r in hung:
        os.kill(pids[r], signal.SIGKILL)  # our own child, by pid
    got = []
    for r, pid in enumerate(pids):
        _, status = os.waitpid(pid, 0)
        raw = data[pipes[r]]
        os.close(pipes[r])
        if r in hung:
            got.append(("hung", f"rank {r} did not finish within {timeout:g} s (killed); "
                                f"its threads:\n{stuck[r]}"))
        elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and not raw:
            got.append(("killed", None))
        elif not raw:
            got.append(("failed", f"rank {r} ended with status {status} and no result"))
        else:
            ok, value = pickle.loads(raw)
            got.append(("ok", value) if ok else ("failed", value))
    os.close(store_w)
    os.waitpid(store_pid, 0)
    stacks.cleanup()
    return got, pids


def _rank(rank: int | None, world_size: int, port: int, fn, kwargs: dict, init: bool,
          out_fd: int, inherited: tuple, stack_file: str) -> None:
    """A forked rank (``rank`` None: a newcomer): init, ``fn``, its pickled ``(ok, result
    or traceback)`` to ``out_fd``, finalize, exit without the zygote's exit handlers."""
    code = 1
    try:
        _die_with_parent()
        for thing in inherited:
            thing.close() if hasattr(thing, "close") else os.close(thing)
        stacks = open(stack_file, "w")
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          TORCHELASTIC_USE_AGENT_STORE="true")
        if rank is not None:
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                              LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
        import commlab

        try:
            comm = commlab.init(backend="cpu") if init else None
            out = (True, pickle.dumps(fn(comm, **kwargs)))
            commlab.finalize()
        except BaseException:
            out = (False, traceback.format_exc())
        payload = pickle.dumps(out)
        view = memoryview(payload)
        while view:
            view = view[os.write(out_fd, view):]
        code = 0
    finally:
        os._exit(code)


def _stack_of(pid: int, stack_file: str) -> str:
    """A hung rank's Python stacks (all threads), asked for with SIGUSR1."""
    try:
        os.kill(pid, signal.SIGUSR1)  # our own child, by pid
    except ProcessLookupError:
        return ""
    time.sleep(0.5)
    try:
        with open(stack_file) as f:
            return f.read()
    except OSError:
        return ""
