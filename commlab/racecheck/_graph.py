"""The wait-for graph of blocked programs: one pure function from the blocked waits of
every rank to the text that names them, the edges and the deadlock, if one is known.

Shared by ``racecheck``'s ``WaitTimeoutError``, the notebook engine's hang report and
``commlab.widgets.WaitGraphView``. A node is one blocked program of one rank, a
JSON-able dict:

    rank, program (int, or [x, y, z]), where ("file:LINE"), kind ("wait" | "barrier"),
    flag_rank (whose heap holds the flag), flag_offset (heap offset), flag (its name,
    optional), op (">=": cl.wait; "==": a barrier mailbox), wants, holds,
    could_notify (the only ranks that can satisfy it, when known: a barrier mailbox;
    None: unknown), last_notified_by (racecheck: the rank whose notify the flag last
    saw, None for none yet; absent where no history is kept)

Who may satisfy a wait (``notifiers``), from what is known:

- "only": ``could_notify`` is given (a barrier mailbox is filled by one rank);
- "last": racecheck's history names the rank that last notified this flag, taken as
  the one that notifies it again (the sentence says so: "last notified by rank 2");
- "any": nothing is known, so any other rank may: an OR-wait, satisfied by the first
  of them that notifies. An edge runs to each, drawn as one OR-fan.

Deadlock, OR-model (Chandy-Misra-Haas): a set of blocked programs none of which can
ever be satisfied is a *knot*: every rank that could satisfy any wait in it has a
program blocked in it (a barrier: the same program of that rank). The knot is the
greatest such set (nodes with a notifier outside it are dropped until none is). A
specific cycle is named only through waits with one possible notifier rank: with
OR-waits a cycle picked among the edges would be made up (3 ranks each waiting for any
other: the true story is "all three wait", not "0 and 1 wait for each other").
"""

from __future__ import annotations

from typing import Any


def who(n: dict) -> str:
    return f"rank {n['rank']} program {n['program']}"


def ranks_text(ranks) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def notifiers(n: dict, world: int) -> tuple[list[int], str]:
    """The ranks that may satisfy ``n`` and how that is known: "only" | "last" | "any"."""
    c = n.get("could_notify")
    if c is not None:
        return sorted(c), "only"
    last = n.get("last_notified_by")
    if last is not None and last != n["rank"]:
        return [last], "last"
    return [r for r in range(world) if r != n["rank"]], "any"


def _line(n: dict, could: list[int], how: str) -> str:
    flag = f"rank {n['flag_rank']}'s flag at heap offset {n['flag_offset']:#x}"
    if n.get("flag"):
        flag += f" ({n['flag']})"
    if n.get("kind") == "barrier":
        flag = flag.replace("flag", "barrier mailbox", 1)
    want = f"exactly {n['wants']}" if n.get("op") == "==" else f"{n['wants']}"
    held = n["holds"] if n.get("holds") is not None else "? (device memory)"
    text = f"{who(n)} at {n['where']} waits on {flag} for {want} and holds {held}"
    if how == "only":
        return text + f"; only {ranks_text(could)} can set it"
    if how == "last":
        return text + f"; last notified by rank {could[0]}"
    never = "; no rank has notified it yet" if "last_notified_by" in n else ""
    if len(could) == 1:
        return text + f"{never}; rank {could[0]}, the only other rank, could notify it"
    return text + f"{never}; any of {ranks_text(could)} could notify it (an OR-wait)"


def build(nodes: list[dict], world: int) -> dict[str, Any]:
    """``nodes``: every rank's blocked waits (see the module docstring). Returns

    ``lines`` (one sentence per node), ``nodes`` (each with ``notifiers`` and ``how``),
    ``edges`` ([i, j]: node i may be satisfied by node j's rank; a node with several
    notifier ranks is an OR-wait over its edges), ``knot`` (node indices of the
    deadlock, [] for none), ``knot_ranks``, ``cycle`` (node indices, first repeated at
    the end, only when every wait on it has one possible notifier; else []),
    ``cycle_ranks``, ``text`` (the verdict)."""
    nodes = sorted(nodes, key=lambda n: (n["rank"], str(n["program"])))
    out_nodes, lines = [], []
    for n in nodes:
        could, how = notifiers(n, world)
        out_nodes.append({**n, "could_notify": n.get("could_notify"), "notifiers": could,
                          "how": how})
        lines.append(_line(n, could, how))
    edges = [[i, j] for i, n in enumerate(out_nodes) for j, m in enumerate(out_nodes)
             if i != j and _satisfies(m, n)]
    knot = _knot(out_nodes)
    # a cycle is known only through waits with one possible notifier rank
    single = {i for i in knot if len(out_nodes[i]["notifiers"]) == 1}
    cycle = _cycle(len(out_nodes), [e for e in edges if e[0] in single and e[1] in knot])
    cycle_ranks = [out_nodes[i]["rank"] for i in cycle]
    knot_ranks = sorted({out_nodes[i]["rank"] for i in knot})
    return {"lines": lines, "nodes": out_nodes, "edges": edges, "knot": knot,
            "knot_ranks": knot_ranks, "cycle": cycle, "cycle_ranks": cycle_ranks,
            "text": _verdict(out_nodes, knot, knot_ranks, cycle)}


def _satisfies(m: dict, n: dict) -> bool:
    """Whether blocked node ``m``'s rank is one that may satisfy ``n`` (a barrier's
    mailbox for program p is filled by program p of its peer)."""
    if m["rank"] not in n["notifiers"]:
        return False
    return n.get("kind") != "barrier" or m["program"] == n["program"]


def _knot(nodes: list[dict]) -> list[int]:
    """The greatest set of nodes each of whose notifier ranks has a node in the set."""
    alive = set(range(len(nodes)))
    changed = True
    while changed:
        changed = False
        for i in sorted(alive):
            n = nodes[i]
            if not all(any(_satisfies(nodes[j], n) for j in alive if nodes[j]["rank"] == r)
                       for r in n["notifiers"]):
                alive.discard(i)
                changed = True
    return sorted(alive)


def _verdict(nodes: list[dict], knot: list[int], knot_ranks: list[int],
             cycle: list[int]) -> str:
    if not nodes:
        return "No program is blocked in cl.wait or cl.barrier."
    guess = any(nodes[i]["how"] == "last" for i in (cycle or knot))
    basis = (" (taking the rank that last notified each flag as the one to notify it "
             "again)") if guess else ""
    if cycle:
        more = sorted(set(knot_ranks) - {nodes[i]["rank"] for i in cycle})
        also = (f" {ranks_text(more)} {'is' if len(more) == 1 else 'are'} blocked behind it "
                f"(every rank that could satisfy {'its' if len(more) == 1 else 'their'} "
                f"waits is blocked).") if more else ""
        return ("Cycle: " + " -> ".join(f"rank {nodes[i]['rank']}" for i in cycle) + " ("
                + " -> ".join(who(nodes[i]) for i in cycle) + f"): a deadlock{basis}."
                + also)
    if knot:
        return (f"Deadlock: {ranks_text(knot_ranks)} are blocked, and every rank that could "
                f"satisfy their waits is blocked among them{basis}; no order of events "
                f"ends it (a knot: no single cycle is known, the waits are OR-waits).")
    free = sorted({r for n in nodes for r in n["notifiers"]}
                  - {n["rank"] for n in nodes})
    return (f"No deadlock among the blocked programs: {ranks_text(free)} could still "
            f"notify (not blocked in a wait: it skipped the notify, finished, or is still "
            f"running).") if free else (
        "No deadlock among the blocked programs: a rank that could notify has a program "
        "that is not blocked.")


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
