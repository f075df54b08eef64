"""Heartbeats for members on other hosts, whose processes ``/proc`` cannot see.

A thread per rank of a world across hosts, on a store connection of its own, counts
``beat/<rank>`` up in the world's store every ``COMMLAB_PEER_TIMEOUT / 4`` s and reads
the counts of the ranks on the other hosts. A member on another host is lost once its
count has not moved for ``COMMLAB_PEER_TIMEOUT`` s (its process died, or its host's link
was cut). The store must outlive ranks and sit where the survivors reach it (the
launcher's, on node 0).

A member's death seen through ``/proc`` by a rank of its own host is final: that rank
``report``s it (``dead/<key>``, and ``dead/n`` counted up, written at once), and every
rank's thread takes such a member as lost at its next beat instead of waiting for the
silence: a SIGKILLed rank is known everywhere within a beat where a host-mate survives.

The thread does every store call: a store out of reach blocks a call for the store's
own timeout (a TCPStore ``add`` does not honour a shorter one), and the thread may block
where the rank must not. So the rank only reads what the thread saw; when the thread got
no answer for the peer timeout, this rank is the one cut off, and it raises
``CommlabError`` saying so.
"""

from __future__ import annotations

import atexit
import threading
import time

import torch.distributed as dist

from commlab.errors import CommlabError


class Beats:
    """This rank's heartbeat thread and what it saw of the other hosts' members."""

    def __init__(self, store: dist.Store, rank: int | str, others: list, peer_timeout: float):
        self.peer_timeout = peer_timeout
        self.every = peer_timeout / 4
        now = time.monotonic()
        # key (a member's rank at init, or a newcomer's: Membership.beat_key) ->
        # (count, when it moved)
        self._seen = {str(r): (-1, now) for r in others}
        self._answered = now  # when the store last answered the thread
        self._stop = threading.Event()
        self._wake = threading.Event()  # a report to write now
        self._reports: list[str] = []  # keys this rank found dead, to write
        self._dead: set[str] = set()  # keys the store says are dead
        self._marks = 0  # dead/n when last read
        self._error = ""
        conn = store.clone()  # type: ignore[attr-defined]  # PrefixStore/TCPStore have it
        conn.add(f"beat/{rank}", 1)  # one beat before init returns
        self._thread = threading.Thread(target=self._run, args=(conn, f"beat/{rank}"),
                                        name="commlab-beat", daemon=True)
        self._thread.start()
        # stopped before the interpreter exits: a thread inside a store call while the
        # process tears torch down aborts it ("terminate called without an active exception")
        atexit.register(self.stop)

    def _run(self, store: dist.Store, key: str) -> None:
        while True:
            self._wake.wait(self.every)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                store.add(key, 1)
                while self._reports:
                    store.set(f"dead/{self._reports.pop()}", "1")
                    store.add("dead/n", 1)
                marks = store.add("dead/n", 0)
                if marks != self._marks:
                    self._marks = marks
                    self._dead |= {r for r in self._seen if r not in self._dead
                                   and store.check([f"dead/{r}"])}
                counts = {r: store.add(f"beat/{r}", 0) for r in self._seen}
            except Exception as e:  # noqa: BLE001 - the store is gone: the rank says so
                self._error = str(e)
                return
            now = time.monotonic()
            for r, count in counts.items():
                if count != self._seen[r][0]:
                    self._seen[r] = (count, now)
            self._answered = now

    def watch(self, keys: list[str]) -> None:
        """Also watch ``keys`` (newcomers on other hosts), silent from now on only."""
        now = time.monotonic()
        self._seen = {**self._seen, **{k: (-1, now) for k in keys if k not in self._seen}}

    def report(self, key: str) -> None:
        """Say that member ``key`` (of this rank's host) is dead, at once."""
        self._reports.append(key)
        self._wake.set()

    def silent(self, rank: int | str) -> bool:
        """Whether ``rank``'s count has not moved for the peer timeout; raises
        CommlabError when this rank has not reached the store for as long."""
        now = time.monotonic()
        if now - self._answered > self.peer_timeout + self.every:
            why = f" ({self._error})" if self._error else ""
            raise CommlabError(
                f"the world's store did not answer for {now - self._answered:.1f} s{why}; "
                f"this host is cut off from the host that serves it, so this rank cannot "
                f"go on: its peers on the other hosts shrink without it")
        if str(rank) in self._dead:  # a rank of its host saw it dead
            return True
        # silent while the store kept answering: a rank cut off itself sees no one silent
        return self._answered - self._seen[str(rank)][1] > self.peer_timeout

    def stop(self) -> None:
        """Stop the thread; waits for its store call in flight (at most a beat or two)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.every + 1.0)
