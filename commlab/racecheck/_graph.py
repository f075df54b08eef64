"""The wait-for graph of blocked programs: one pure function from the blocked waits of
every rank to the text that names them, the edges and any cycle.

Shared by ``racecheck``'s ``WaitTimeoutError`` and the notebook engine's hang report.
A node is one blocked program of one rank, a JSON-able dict:

    rank, program (int, or [x, y, z]), where ("file:LINE"), kind ("wait" | "barrier"),
    flag_rank (whose heap holds the flag), flag_offset (heap offset), flag (its name,
    optional), op (">=": cl.wait; "==": a barrier mailbox), wants, holds,
    could_notify (ranks that could satisfy it; None: any other rank),
    last_notified_by (racecheck only; absent elsewhere)

An edge runs from a node to each blocked node that could satisfy it (a barrier waits
on program p of its peer only); a cycle among blocked nodes is a deadlock no timing
ends.
"""

from __future__ import annotations

from typing import Any


def who(n: dict) -> str:
    return f"rank {n['rank']} program {n['program']}"


def _could(n: dict, world: int) -> list[int]:
    c = n.get("could_notify")
    return list(c) if c is not None else [r for r in range(world) if r != n["rank"]]


def _line(n: dict, could: list[int]) -> str:
    flag = f"rank {n['flag_rank']}'s flag at heap offset {n['flag_offset']:#x}"
    if n.get("flag"):
        flag += f" ({n['flag']})"
    if n.get("kind") == "barrier":
        flag = flag.replace("flag", "barrier mailbox", 1)
    want = f"exactly {n['wants']}" if n.get("op") == "==" else f"{n['wants']}"
    held = n["holds"] if n.get("holds") is not None else "? (device memory)"
    text = f"{who(n)} at {n['where']} waits on {flag} for {want} and holds {held}"
    if "last_notified_by" in n:
        last = n["last_notified_by"]
        text += f"; last notified by {'rank ' + str(last) if last is not None else 'no rank'}"
    if could:
        text += ", could be by " if "last_notified_by" in n else "; could be by "
        text += ", ".join(f"rank {x}" for x in could)
    return text


def build(nodes: list[dict], world: int) -> dict[str, Any]:
    """``nodes``: every rank's blocked waits (see the module docstring). Returns
    ``{"lines": [one sentence per node], "nodes": nodes (could_notify filled),
    "edges": [[i, j], ...] (node indices), "cycle": [node index, ...] (first repeated
    at the end; [] for none), "cycle_ranks": [rank, ...], "text": the cycle sentence}``.
    """
    nodes = sorted(nodes, key=lambda n: (n["rank"], str(n["program"])))
    out_nodes, lines = [], []
    for n in nodes:
        could = _could(n, world)
        out_nodes.append({**n, "could_notify": could})
        lines.append(_line(n, could))
    edges = []
    for i, n in enumerate(out_nodes):
        for j, m in enumerate(out_nodes):
            if i == j or m["rank"] not in n["could_notify"]:
                continue
            if n.get("kind") == "barrier" and m["program"] != n["program"]:
                continue
            edges.append([i, j])
    cycle = _cycle(len(out_nodes), edges)
    ranks = [out_nodes[i]["rank"] for i in cycle]
    if cycle:
        text = ("Cycle: " + " -> ".join(f"rank {r}" for r in ranks) + " ("
                + " -> ".join(who(out_nodes[i]) for i in cycle) + ").")
    elif out_nodes:
        text = ("No cycle among blocked programs: a rank that could notify is not waiting "
                "(it skipped the notify or finished).")
    else:
        text = "No program is blocked in cl.wait or cl.barrier."
    return {"lines": lines, "nodes": out_nodes, "edges": edges, "cycle": cycle,
            "cycle_ranks": ranks, "text": text}


def report(nodes: list[dict], world: int) -> str:
    """The graph as lines of text for the hang report (empty when no node)."""
    if not nodes:
        return ""
    g = build(nodes, world)
    return "\n".join(["Wait-for graph (programs blocked in cl.wait/cl.barrier):",
                      *(f"    {ln}" for ln in g["lines"]), f"    {g['text']}"])


def _cycle(n: int, edges: list[list[int]]) -> list[int]:
    """The first cycle found by a depth-first walk from each node in order, or []."""
    succ: dict[int, list[int]] = {i: [] for i in range(n)}
    for a, b in edges:
        succ[a].append(b)
    done: set[int] = set()
    for start in range(n):
        if start in done:
            continue
        path, on_path, stack = [start], {start}, [iter(succ[start])]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                on_path.discard(path[-1])
                done.add(path.pop())
                stack.pop()
                continue
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt in done:
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(succ[nxt]))
    return []
