"""Wait timeouts and the wait-for graph.

A blocked ``cl.wait``/``cl.barrier`` polls from the host; past ``wait_timeout`` its
rank publishes what each of its blocked programs waits for (program, ``file:line``,
flag, wanted and held value) in the shared sync log, gives the other ranks a moment to
do the same, and raises ``WaitTimeoutError`` with every blocked program's entry, who
last notified each flag, who could, and the deadlock if one is known (``_graph``).
"""

from __future__ import annotations

import time
from typing import Any

from commlab.errors import WaitTimeoutError
from commlab.racecheck import _blocked, _graph, _where


class Waits:
    def __init__(self, chk):
        self.chk = chk
        self.last: dict[str, Any] = {"edges": [], "cycle": []}  # the last graph built

    def event(self, event, addr, value):
        chk = self.chk
        if event == "begin":
            chk.hint = (addr, value)
            chk.waiting = None
            return
        if chk.wait_timeout is None or chk.waiting is None:
            return
        if time.monotonic() - chk.blocked_since > chk.wait_timeout:
            text, nodes, cycle = self.graph()
            err = WaitTimeoutError(text)
            # for drawing: one dict per blocked program, the edges between them (node
            # indices), the cycle as ranks and as node indices
            err.graph, err.cycle = nodes, cycle
            err.edges, err.cycle_nodes = self.last["edges"], self.last["cycle"]
            err.wait_graph = self.last  # the whole graph: commlab.widgets.WaitGraphView
            raise err

    def graph(self) -> tuple[str, list[dict[str, Any]], list[Any]]:
        chk = self.chk
        mine = chk.blocked_programs()
        sh = chk.shared
        sh.lock()
        try:
            sh.sync.append(("blocked", chk.rank, mine))
        finally:
            sh.unlock()
        time.sleep(min(1.0, max(0.2, chk.wait_timeout / 2)))  # the others time out too
        sh.lock()
        try:
            chk._read_sync()
        finally:
            sh.unlock()
        blocked = {}
        for rec in sh.sync.records:
            if rec[0] == "blocked":
                blocked[rec[1]] = rec[2]
        nodes = []
        for r in sorted(blocked):
            for pid, where, key, want, have, op in blocked[r]:
                hist = chk.history.get(key, [])
                last = next((h[2] for h in reversed(hist) if h[1] is not None), None)
                kind = "barrier" if op == "==" else "wait"
                # who else may notify a flag is not known (_graph: "last" or an OR-wait);
                # a barrier mailbox has one writer
                could = _blocked.mailbox_writer(kind, want, key[0], chk.comm.heap, key[1])
                nodes.append({"rank": r, "program": _where.program(pid), "where": where,
                              "kind": kind,
                              "flag_rank": key[0], "flag_offset": key[1],
                              "flag": _where.flag(chk.comm.heap, key[1]), "op": op,
                              "wants": want, "holds": have, "last_notified_by": last,
                              "could_notify": could})
        g = _graph.build(nodes, chk.world)
        self.last = g
        lines = "".join(f"\n  {ln}." for ln in g["lines"])
        return (f"cl.wait/cl.barrier unsatisfied after {chk.wait_timeout:g} s on rank "
                f"{chk.rank}. Wait-for graph:{lines}\n{g['text']}{_where.schedule(chk)}\n"
                f"Call comm.recover() on every rank before the next collective.",
                g["nodes"], g["cycle_ranks"])
