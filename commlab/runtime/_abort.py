"""The host's half of the GPU abort word (``wait_records``): a thread per CUDA
communicator that looks at the members every ``look_s`` (at most 50 ms) and sets the word
once one is lost, so this rank's kernels spinning on a dead peer return, whatever its
Python thread is blocked in (a CUDA synchronize holds no Python check). The host then
raises RankLostError at its next wait (the agreement, ``commlab.synchronize()``). On the
CPU backend the interpreter asks the members itself (``_watch``)."""

from __future__ import annotations

import threading

import torch

from commlab.runtime import membership, wait_records
from commlab.runtime.membership import Membership


class AbortWatch:
    """Sets ``records``' abort word when a member of ``members`` dies; ``stop()`` ends it."""

    def __init__(self, members: Membership, records: torch.Tensor | None):
        self.members, self.records = members, records
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commlab-abort-watch",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        m = self.members
        while not self._stop.wait(m.look_s):
            if any(r != m.rank and not membership.alive(pid) for r, pid in enumerate(m.pids)):
                wait_records.abort(self.records)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
