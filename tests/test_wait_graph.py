"""The wait-for graph as a pure function (commlab.racecheck.wait_graph): edges from each
blocked program to the blocked programs that could satisfy it, cycles, the sentences."""

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
           "(flag[0]) for 1 and holds 0; could be by rank 1, rank 2" in text
    assert "holds ? (device memory); could be by rank 2" in text
    assert "No cycle among blocked programs" in text
    assert wait_graph_text([], 2) == ""


def test_a_cycle_through_two_programs_of_one_rank_names_both():
    # rank 0 program 0 waits on rank 1; rank 1 waits on rank 0, whose program 1 is blocked
    g = wait_graph([node(0, 0, could=[1]), node(1, 0, could=[0]), node(0, 1, could=[0])], 2)
    assert g["cycle_ranks"] == [0, 1, 0]
    assert g["text"].startswith("Cycle: rank 0 -> rank 1 -> rank 0 (rank 0 program 0 -> ")
