"""The wait-for graph as a pure function (commlab.racecheck.wait_graph): edges from each
blocked program to the blocked programs that could satisfy it, OR-waits, the deadlock as
a knot, a cycle only where one is known, the sentences."""

from __future__ import annotations

from commlab.racecheck import wait_graph, wait_graph_text


def node(rank, program, kind="wait", could=None, holds=0, wants=1, **kw):
    return {"rank": rank, "program": program, "where": "k.py:7", "kind": kind,
            "flag_rank": rank, "flag_offset": 0x1000 + 4 * program,
            "op": "==" if kind == "barrier" else ">=", "wants": wants, "holds": holds,
            "could_notify": could, **kw}


def test_a_barrier_mailbox_waits_only_on_the_same_program_of_its_peer():
    g = wait_graph([node(0, 0, "barrier", [1]), node(0, 1, "barrier", [1]),
                    node(1, 1, "barrier", [0])], 2)
    names = [(n["rank"], n["program"]) for n in g["nodes"]]
    edges = {(names[a], names[b]) for a, b in g["edges"]}
    assert edges == {((0, 1), (1, 1)), ((1, 1), (0, 1))}
    assert [names[i] for i in g["cycle"]] == [(0, 1), (1, 1), (0, 1)]
    assert g["cycle_ranks"] == [0, 1, 0]
    assert "barrier mailbox" in g["lines"][0] and "for exactly 1" in g["lines"][0]


def test_a_wait_nobody_else_is_blocked_for_has_no_cycle():
    text = wait_graph_text([node(0, 0, flag="flag[0]"), node(0, 1, could=[2], holds=None)], 3)
    assert "rank 0 program 0 at k.py:7 waits on rank 0's flag at heap offset 0x1000 " \
           "(flag[0]) for 1 and holds 0; any of ranks 1, 2 could notify it (an OR-wait)" in text
    assert "holds ? (device memory); only rank 2 can set it" in text
    assert "No deadlock among the blocked programs: ranks 1, 2 could still notify" in text
    assert wait_graph_text([], 2) == ""


def test_a_cycle_through_two_programs_of_one_rank_names_both():
    # rank 0 program 0 waits on rank 1; rank 1 waits on rank 0, whose program 1 is blocked
    g = wait_graph([node(0, 0, could=[1]), node(1, 0, could=[0]), node(0, 1, could=[0])], 2)
    assert g["cycle_ranks"] == [0, 1, 0]
    assert g["text"].startswith("Cycle: rank 0 -> rank 1 -> rank 0 (rank 0 program 0 -> ")


def test_three_ranks_each_waiting_for_any_other_are_a_knot_not_a_made_up_cycle():
    # issue 31: each rank waits for its predecessor; with no history the graph knows only
    # that any other rank could notify, so it must not name the cycle 0 -> 1 -> 0
    g = wait_graph([node(r, 0) for r in range(3)], 3)
    assert [n["how"] for n in g["nodes"]] == ["any"] * 3
    assert all(len(n["notifiers"]) == 2 for n in g["nodes"])
    assert len(g["edges"]) == 6  # each node's OR-fan: both other ranks
    assert g["knot_ranks"] == [0, 1, 2] and g["cycle"] == [] and g["cycle_ranks"] == []
    assert g["text"].startswith("Deadlock: ranks 0, 1, 2 are blocked, and every rank that "
                                "could satisfy their waits is blocked among them;"), g["text"]
    assert "Cycle" not in g["text"]
    assert "any of ranks 1, 2 could notify it (an OR-wait)" in g["lines"][0]


def test_the_rank_that_last_notified_a_flag_names_the_real_ring():
    # racecheck's history: each flag was last notified by the predecessor
    g = wait_graph([node(r, 0, last_notified_by=(r - 1) % 3) for r in range(3)], 3)
    assert "last notified by rank 2" in g["lines"][0]
    assert g["cycle_ranks"] == [0, 2, 1, 0], g
    assert g["text"].startswith("Cycle: rank 0 -> rank 2 -> rank 1 -> rank 0 (")
    assert "taking the rank that last notified each flag" in g["text"]


def test_an_or_wait_one_of_whose_notifiers_runs_is_no_deadlock():
    # ranks 0 and 1 wait for any other rank; rank 2 is not blocked: it may notify either
    g = wait_graph([node(0, 0), node(1, 0)], 3)
    assert g["knot"] == [] and g["cycle"] == []
    assert g["text"].startswith("No deadlock among the blocked programs: rank 2 could still")


def test_a_knot_keeps_only_the_waits_no_running_rank_can_satisfy():
    # 0 and 1 wait only for each other (a real cycle); 2 waits for any other rank, and
    # rank 4 runs, so 2 may still be notified; 3 waits only for rank 4
    nodes = [node(0, 0, could=[1]), node(1, 0, could=[0]), node(2, 0), node(3, 0, could=[4])]
    g = wait_graph(nodes, 5)
    assert g["knot_ranks"] == [0, 1]
    assert g["cycle_ranks"] == [0, 1, 0] and g["text"].startswith("Cycle: rank 0 -> rank 1")
    # in a world of 3 every rank is blocked: rank 2's OR-wait joins the knot, behind the
    # cycle of 0 and 1 (which its OR-wait is not part of)
    g = wait_graph(nodes[:3], 3)
    assert g["knot_ranks"] == [0, 1, 2] and g["cycle_ranks"] == [0, 1, 0]
    assert g["text"].endswith("rank 2 is blocked behind it (every rank that could satisfy "
                              "its waits is blocked)."), g["text"]
