"""The launcher's loop: start the workers, watch them, replace the lost, end cleanly.

A worker that exits with an error or a signal while the job runs is *lost*: the launcher
says so (which rank, its pid, how it ended) and leaves the others running; they see
``RankLostError`` within ``COMMLAB_PEER_TIMEOUT`` and call ``commlab.shrink()``. While
``--max-restarts`` allows, it starts a replacement in the same slot with
``COMMLAB_JOIN=1``, which joins the running world when the members call
``commlab.grow``. Once some worker has finished with exit code 0 the job is ending: a
later failure is a failure of the job, and nothing is replaced.

Exit status: 0 when some worker finished with 0 and none failed after that (lost workers
are reported, not fatal); 128 + N after a forwarded signal N; else 1.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from commlab.run import _workers
from commlab.run._args import RunConfig
from commlab.run._store import Store, free_port
from commlab.run._workers import Worker, exit_str

BEAT_S = 1.0  # a host's launcher says it is alive to node 0 this often


class Launcher:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.port = cfg.master_port or free_port(cfg.master_addr)
        self.live: list[Worker] = []
        self.ended: list[tuple[Worker, int]] = []  # (worker, exit code) in order of ending
        self.restarts = 0
        self.finishing = False  # a worker finished with 0: the job is ending
        self.failed_late: list[tuple[Worker, int]] = []
        self.signalled: int | None = None
        self.store: Store | None = None
        self._stop_beat = threading.Event()

    def say(self, text: str) -> None:
        where = f"[node {self.cfg.node_rank}]" if self.cfg.nnodes > 1 else ""
        sys.stderr.write(f"commlab.run{where}: {text}\n")
        sys.stderr.flush()

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        if cfg.node_rank == 0:
            self.store = Store(cfg.master_addr, self.port, cfg.world_size, serve=True)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        beat = None
        try:
            if cfg.node_rank != 0 and cfg.nnodes > 1:
                beat = threading.Thread(target=self._beat, name="commlab-run-beat",
                                        daemon=True)
                beat.start()
            self.live = [_workers.start(cfg, self.port, lr, 0)
                         for lr in range(cfg.nproc_per_node)]
            self.say(f"{cfg.nproc_per_node} workers started (ranks "
                     f"{self.live[0].rank}..{self.live[-1].rank} of {cfg.world_size}), "
                     f"store {cfg.master_addr}:{self.port}"
                     f"{' served here' if self.store else ''}")
            while self.live and self.signalled is None:
                self._poll()
                time.sleep(0.02)
            if self.signalled is not None:
                name = signal.Signals(self.signalled).name
                self.say(f"{name} received: forwarded to {self._names(self.live)}")
                _workers.end(self.live, self.signalled, cfg.grace_s)
                for w in self.live:
                    self.ended.append((w, w.proc.returncode))
                self.live = []
        finally:
            _workers.end(self.live, signal.SIGKILL, 0)  # only after an error of our own
            for s, h in old.items():
                signal.signal(s, h)
            self._stop_beat.set()
            self._finish_nodes(beat)
        return self._status()

    def _on_signal(self, sig, frame) -> None:
        if self.signalled is None:
            self.signalled = sig

    def _poll(self) -> None:
        for w in list(self.live):
            code = w.proc.poll()
            if code is None:
                continue
            self.live.remove(w)
            self.ended.append((w, code))
            if code == 0:
                self.finishing = True
            elif self.finishing:
                self.failed_late.append((w, code))
                self.say(f"{w.name()} failed ({exit_str(code)}) after others had finished")
            else:
                self._lost(w, code)

    def _lost(self, w: Worker, code: int) -> None:
        left = len(self.live)
        text = (f"{w.name()} was lost ({exit_str(code)}); {left} "
                f"{'worker' if left == 1 else 'workers'} of this host "
                f"{'keeps' if left == 1 else 'keep'} running")
        if self.restarts < self.cfg.max_restarts:
            self.restarts += 1
            new = _workers.start(self.cfg, self.port, w.local_rank, self.restarts,
                                 replacement=True)
            self.live.append(new)
            text += (f"; started a replacement (pid {new.pid}, COMMLAB_JOIN=1; "
                     f"{self.cfg.max_restarts - self.restarts} restarts left)")
        elif self.cfg.max_restarts:
            text += f"; not replaced (--max-restarts {self.cfg.max_restarts} used up)"
        self.say(text)

    def _status(self) -> int:
        if self.signalled is not None:
            return 128 + int(self.signalled)
        lost = [(w, c) for w, c in self.ended if c != 0 and (w, c) not in self.failed_late]
        done = [w for w, c in self.ended if c == 0]
        if done and not self.failed_late:
            if lost:
                self.say(f"finished: {len(done)} workers exited 0; lost on the way: "
                         f"{', '.join(f'{w.name()} ({exit_str(c)})' for w, c in lost)}")
            return 0
        failed = sorted(((w, c) for w, c in self.ended if c != 0), key=lambda e: e[0].rank)
        self.say("failed: " + ", ".join(f"{w.name()} {exit_str(c)}" for w, c in failed))
        return 1

    @staticmethod
    def _names(ws: list[Worker]) -> str:
        return ", ".join(f"pid {w.pid}" for w in ws) or "no worker"

    # -- several hosts ------------------------------------------------------------------------
    def _client(self, timeout_s: float) -> Store:
        return Store(self.cfg.master_addr, self.port, self.cfg.world_size, serve=False,
                     connect_timeout_s=timeout_s)

    def _beat(self) -> None:
        """Node i > 0: count ``launcher/beat/<i>`` up every BEAT_S while it runs, so node 0
        knows to keep serving the store (a host cut off stops beating)."""
        try:
            client = self._client(60)
            while not self._stop_beat.wait(BEAT_S):
                client.raw.add(f"launcher/beat/{self.cfg.node_rank}", 1)
        except Exception:  # noqa: BLE001 - node 0 gone or cut off: our workers will say so
            return

    def _finish_nodes(self, beat: threading.Thread | None) -> None:
        cfg = self.cfg
        if cfg.nnodes == 1:
            pass
        elif cfg.node_rank != 0:
            if beat is not None:
                beat.join(BEAT_S + 1)
            try:
                self._client(5).node_done(cfg.node_rank)
            except Exception as e:  # noqa: BLE001 - node 0 unreachable: nothing to tell
                self.say(f"could not tell node 0 that this host is done ({e})")
        else:
            self._linger()
        if self.store is not None:
            self.store.close()

    def _linger(self) -> None:
        """Node 0 serves the store until every other host's launcher is done, or stopped
        beating for ``cfg.linger_s`` (a host cut off)."""
        assert self.store is not None
        others = list(range(1, self.cfg.nnodes))
        seen = {n: (-1, time.monotonic()) for n in others}
        while others:
            now = time.monotonic()
            for n in list(others):
                if self.store.wait_nodes([n], 0) == []:
                    others.remove(n)
                    continue
                beats = self.store.raw.add(f"launcher/beat/{n}", 0)
                if beats != seen[n][0]:
                    seen[n] = (beats, now)
                elif now - seen[n][1] > self.cfg.linger_s:
                    self.say(f"node {n}'s launcher stopped answering {self.cfg.linger_s:g} s "
                             f"ago; no longer serving the store for it")
                    others.remove(n)
            time.sleep(0.2)
