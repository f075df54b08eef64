"""Reaching a world's ranks wherever they run: through each engine's agent (the hub:
signals, stacks, liveness, status), and by pid only for processes launched here.

``World`` inherits these; they use its ``ranks``, ``agents``, ``hub``, ``plan`` and
``client``.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from commlab.engine._hub import Agent
from commlab.engine._launch import SHUTDOWN_WAIT_S, end_engines
from commlab.engine._pids import end_pids


@dataclass
class RankInfo:
    rank: int
    eid: int  # ipyparallel engine id
    pid: int
    device: str
    host: str = ""  # the engine's hostname
    heap: str = ""  # "shm" | "symmetric" | "ipc" (comm.heap_kind)
    shared_gpu: str = ""  # comm.shared_gpu: which ranks share a GPU, or ""


class RankControl:
    ranks: list[RankInfo]
    agents: dict[int, Agent]
    hub: Any
    plan: Any
    client: Any
    backend: str
    broken: str

    @property
    def size(self) -> int:
        return len(self.ranks)

    def here(self, ri: RankInfo) -> bool:
        """Whether rank ``ri`` runs on this machine (its pid means something here)."""
        return self.plan.launcher == "local" or ri.host == socket.gethostname()

    def rank_alive(self, ri: RankInfo) -> bool:
        """Whether rank ``ri``'s engine is alive: its agent's connection is open."""
        agent = self.agents.get(ri.eid)
        return agent is not None and agent.alive

    def _agents(self, ranks: list[int]) -> tuple[list[int], list[Agent]]:
        pairs = [(ri.rank, self.agents[ri.eid]) for ri in self.ranks
                 if ri.rank in ranks and ri.eid in self.agents]
        return [r for r, _ in pairs], [a for _, a in pairs]

    def _end_ranks(self, ranks: list[RankInfo]) -> None:
        """ipyparallel's shutdown request; then engines here by pid, the others through
        their agent (``exit``) when they have not ended within ``SHUTDOWN_WAIT_S``."""
        end_engines(self.client, [ri.eid for ri in ranks if self.rank_alive(ri)],
                    [ri.pid for ri in ranks if self.here(ri)])
        away = [ri for ri in ranks if not self.here(ri)]
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        while any(self.rank_alive(ri) for ri in away) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [self.agents[ri.eid] for ri in away if self.rank_alive(ri)]
        if left:
            self.hub.ask(left, "exit", timeout=1.0)

    def kill(self, ranks: list[int]) -> None:
        """End ranks ``ranks`` now: by pid here, through their agent elsewhere."""
        infos = [ri for ri in self.ranks if ri.rank in ranks]
        end_pids([ri.pid for ri in infos if self.here(ri)], grace=0.0)
        away = [self.agents[ri.eid] for ri in infos if not self.here(ri) and self.rank_alive(ri)]
        if away:
            self.hub.ask(away, "exit", timeout=2.0)

    def signal(self, ranks: list[int], sig: int) -> None:
        """Send ``sig`` to the engines of ``ranks`` through their agents (SIGINT raises
        KeyboardInterrupt in the rank's main thread), wherever they run."""
        _, agents = self._agents(ranks)
        self.hub.ask(agents, "signal", timeout=2.0, sig=int(sig))

    def dump_stacks(self, ranks: list[int]) -> tuple[dict[int, str], dict[int, list]]:
        """Each rank's Python stack (all threads, faulthandler's format) and its kernels'
        blocked waits (``_worker.current_waits``), from its agent's thread: needs the
        rank's main thread to let go of the GIL, which sleeping, waiting at a commlab
        agreement or on the GPU all do."""
        order, agents = self._agents(ranks)
        replies = self.hub.ask(agents, "stacks", timeout=3.0)
        stacks: dict[int, str] = {}
        waits: dict[int, list] = {}
        for r, reply in zip(order, replies, strict=True):
            stacks[r] = str((reply or {}).get("stacks", ""))
            waits[r] = list((reply or {}).get("waits") or [])
        return stacks, waits

    def call_records(self, seen: int = 0, limit: int = 512, timeout: float = 2.0) -> dict:
        """Rank 0's call records after the first ``seen`` (every rank's entries and ends:
        its book reads all the rings), through its agent, so it answers while a cell
        runs: {"seen": total collected, "records": [CallRecord.to_dict()], "off"/"error"
        when there are none to give}."""
        _, agents = self._agents([0])
        if not agents:
            return {"seen": seen, "records": [], "error": "rank 0 has no agent"}
        reply = self.hub.ask(agents, "records", timeout=timeout, seen=int(seen),
                             limit=int(limit))[0]
        return reply if reply is not None else {"seen": seen, "records": [],
                                                "error": "rank 0 did not answer in time"}

    def status(self) -> str:
        heap = self.ranks[0].heap if self.ranks else ""
        gen = getattr(self, "generation", 0)  # shrinks and grows so far (membership)
        lines = [f"world of {self.size} ranks, backend {self.backend}"
                 + (f", {heap} heap" if heap else "") + f", generation {gen}"
                 + (f"  [BROKEN: {self.broken}]" if self.broken else "")]
        if self.ranks and self.ranks[0].shared_gpu:
            lines.append(f"  {self.ranks[0].shared_gpu}")
        _, agents = self._agents([ri.rank for ri in self.ranks])
        infos = self.hub.ask(agents, "info", timeout=2.0)
        for ri, info in zip(self.ranks, infos, strict=True):
            up = self.rank_alive(ri) and info is not None
            busy = bool(self.client.queue_status(targets=ri.eid).get("queue", 0)) if up \
                else False
            mem = (info or {}).get("rss", 0) / 2**20
            lines.append(f"  rank {ri.rank}: {ri.host}, engine {ri.eid}, pid {ri.pid}, "
                         f"{ri.device}, {'alive' if up else 'DEAD'}{', busy' if busy else ''}, "
                         f"{mem:.0f} MiB")
        return "\n".join(lines)
