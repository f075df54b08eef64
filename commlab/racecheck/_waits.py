"""Wait timeouts and the wait-for graph.

A blocked ``cl.wait``/``cl.barrier`` polls from the host; past ``wait_timeout`` its
rank publishes what it waits for (program, ``file:line``, flag, wanted and held value)
in the shared sync log, gives the other ranks a moment to do the same, and raises
``WaitTimeoutError`` with every blocked rank's entry, who last notified each flag,
who could, and any cycle among blocked ranks.
"""

from __future__ import annotations

import time
from typing import Any

from commlab.errors import WaitTimeoutError
from commlab.racecheck import _where


class Waits:
    def __init__(self, chk):
        self.chk = chk

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
            err.graph, err.cycle = nodes, cycle  # for drawing: one dict per blocked rank
            raise err

    def graph(self) -> tuple[str, list[dict[str, Any]], list[Any]]:
        chk = self.chk
        key, want, where, pid, have = chk.waiting
        sh = chk.shared
        sh.lock()
        try:
            sh.sync.append(("blocked", chk.rank, pid, where, key, want, have))
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
                blocked[rec[1]] = rec[1:]
        lines, edges, nodes = [], {}, []
        for r in sorted(blocked):
            _, p, w, k, want_r, have_r = blocked[r]
            hist = chk.history.get(k, [])
            last = next((h[2] for h in reversed(hist) if h[1] is not None), None)
            could = sorted({h[2] for h in hist if h[1] is not None}) or [
                x for x in range(chk.world) if x != r]
            edges[r] = could
            prog = p[0] if p[1] == 0 and p[2] == 0 else p
            nodes.append({"rank": r, "program": prog, "where": w, "flag_rank": k[0],
                          "flag_offset": k[1], "wants": want_r, "holds": have_r,
                          "last_notified_by": last, "could_notify": could})
            lines.append(
                f"rank {r} program {prog} at {w} waits on rank {k[0]}'s flag at heap offset "
                f"{k[1]:#x} for {want_r} and holds {have_r}; last notified by "
                f"{'rank ' + str(last) if last is not None else 'no rank'}, could be by "
                + ", ".join(f"rank {x}" for x in could))
        cycle = _cycle(edges)
        tail = (" Cycle: " + " -> ".join(f"rank {x}" for x in cycle) + "." if cycle else
                " No cycle among blocked ranks: a rank that could notify is not waiting "
                "(it skipped the notify or finished).")
        tail += _where.schedule(chk)
        return (f"cl.wait/cl.barrier unsatisfied after {chk.wait_timeout:g} s on rank "
                f"{chk.rank}. Wait-for graph: " + "; ".join(lines) + "." + tail +
                " Call comm.recover() on every rank before the next collective.",
                nodes, cycle)


def _cycle(edges: dict) -> list:
    """A cycle through blocked ranks only (each waits only on blocked ranks), or []."""
    for start in sorted(edges):
        path, seen, node = [start], {start}, start
        while True:
            nxt = [x for x in edges.get(node, []) if x in edges]
            if not nxt:
                break
            node = nxt[0]
            if node in seen:
                return path[path.index(node):] + [node]
            path.append(node)
            seen.add(node)
    return []
