"""bench/adapt_bench.py's judge on synthetic phases: the paired totals from call 200 on,
their 90% intervals and how far the table's choice is from the best."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "adapt_bench.py"
_spec = importlib.util.spec_from_file_location("adapt_bench", _PATH)
adapt_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(adapt_bench)


def _phase(table: str, two_shot_us: float, rounds: int = 30, block: int = 20) -> dict:
    """Every round: adaptive and one_shot calls 100 us (+-1% by call), two_shot's as
    given, ring 100x; the adaptive held one_shot from its first call."""
    n = rounds * block

    def wobble(t: float, k: int) -> list[float]:
        return [t * (1 + 0.01 * ((i * 7 + k) % 5 - 2) / 2) for i in range(k)]

    return {"block": block, "ring_per_round": 1, "learning_calls": 100, "table": table,
            "fixed_us": {"one_shot": 100.0, "two_shot": two_shot_us, "ring": 1e4},
            "fixed_times_us": {"one_shot": wobble(100.0, n), "two_shot": wobble(two_shot_us, n),
                               "ring": wobble(1e4, rounds)},
            "fixed_waits": {"one_shot": [0] * n, "two_shot": [0] * n, "ring": [0] * rounds},
            "adaptive_times_us": wobble(100.0, n), "adaptive_choice": ["one_shot"] * n,
            "adaptive_ran": ["one_shot"] * n, "adaptive_waits": [0] * n}


def test_a_table_wrong_by_half_is_beaten_by_ten_percent_within_a_tight_interval():
    r = adapt_bench.judge(_phase("two_shot", 150.0))
    assert r["goal_best"] and r["goal_table"] and r["table_wrong"]
    assert r["table_excess"] == pytest.approx(0.5, abs=0.02)
    lo, hi = r["paired_vs_best_90"]
    assert lo <= r["paired_vs_best"] <= hi and hi - lo < 0.02
    assert r["paired_vs_table_90"][0] <= r["paired_vs_table"] <= r["paired_vs_table_90"][1]
    assert r["rounds_judged"] == 20 and r["from_call"] == 200  # judged from call 200 on


def test_a_table_wrong_by_less_than_ten_percent_cannot_be_beaten_by_ten():
    r = adapt_bench.judge(_phase("two_shot", 105.0))
    assert r["table_wrong"] and r["table_excess"] < 0.10 and not r["goal_table"]


def test_a_right_table_is_not_judged_on_the_gain():
    r = adapt_bench.judge(_phase("one_shot", 150.0))
    assert not r["table_wrong"] and r["goal_table"] and r["table_excess"] == 0.0


def test_which_algorithms_are_near_the_best_is_read_round_by_round():
    # two_shot is as fast as one_shot in most rounds, but the machine slows down 30%
    # and two_shot's blocks met it 4 rounds earlier: its phase cost is ~4% above
    # one_shot's, its paired ratio 1.0; an adaptive key holding two_shot is on the
    # best, and a table that says two_shot is not wrong
    p = _phase("two_shot", 100.0)
    n, block = len(p["adaptive_times_us"]), p["block"]
    for k, rounds in (("one_shot", 12), ("two_shot", 8)):
        p["fixed_times_us"][k] = [t * (1.3 if i // block >= rounds else 1.0)
                                  for i, t in enumerate(p["fixed_times_us"][k])]
    p["adaptive_times_us"] = [t * (1.3 if i // block >= 12 else 1.0)
                              for i, t in enumerate(p["adaptive_times_us"])]
    p["adaptive_choice"] = p["adaptive_ran"] = ["two_shot"] * n
    r = adapt_bench.judge(p)
    assert r["within_3pct_unpaired"] == ["one_shot"]
    assert r["within_3pct"] == ["one_shot", "two_shot"]
    assert r["settled_after_calls"] == 0 and r["goal_best"]
    assert not r["table_wrong"] and r["goal_table"]


def test_rare_costly_calls_count_in_the_judged_time():
    # one ring call (100x) in every other round: the median round is on the best, the
    # loop of calls is ~2.5x slower (what a user of ``auto`` would pay)
    p = _phase("one_shot", 150.0)
    block = p["block"]
    for i in range(0, len(p["adaptive_times_us"]), 2 * block):
        p["adaptive_times_us"][i + 5] = 1e4
        p["adaptive_ran"][i + 5] = "ring"
    r = adapt_bench.judge(p)
    assert abs(r["median_round_vs_best"]) < 0.01
    assert r["paired_vs_best"] > 1.0 and not r["goal_best"]


def test_a_switch_late_by_two_rounds_after_a_mid_phase_change_misses_three_percent():
    # two_shot is the best until round 15, then 2x slower; online selection follows
    # one_shot from round 17: 40 extra calls of 100 us over 300 judged calls
    p = _phase("one_shot", 95.0)
    block, n = p["block"], len(p["adaptive_times_us"])
    p["fixed_times_us"]["two_shot"] = [t * (2 / 0.95 if i // block >= 15 else 1.0)
                                       for i, t in enumerate(p["fixed_times_us"]["two_shot"])]
    p["adaptive_times_us"] = [p["fixed_times_us"]["two_shot"][i] if i // block < 17
                              else p["fixed_times_us"]["one_shot"][i] for i in range(n)]
    p["adaptive_choice"] = p["adaptive_ran"] = ["two_shot" if i // block < 17 else "one_shot"
                                                for i in range(n)]
    r = adapt_bench.judge(p)
    assert r["best"] == "one_shot"  # the least time from call 200 on
    # rounds 10-14 two_shot 5% faster, 15-16 twice as slow, then one_shot: (-5 x 100 + 100
    # x 40) us over 400 calls of 100 us
    assert r["paired_vs_best"] == pytest.approx(3500 / 40000, abs=0.005)
    assert not r["goal_best"]


def test_a_phase_too_short_to_judge_says_how_many_calls_it_needs():
    p = _phase("one_shot", 150.0, rounds=8)
    with pytest.raises(ValueError, match=r"more than 220 adaptive calls, it has 160"):
        adapt_bench.judge(p)


def test_the_time_over_the_best_is_split_by_kind_of_call():
    # a decision of +200 us every 50 calls, a ring exploration (+9900 us) every 500
    p = _phase("one_shot", 150.0)
    n = len(p["adaptive_times_us"])
    p["adaptive_decided"] = [i % 50 == 19 for i in range(n)]
    for i in range(n):
        if p["adaptive_decided"][i]:
            p["adaptive_times_us"][i] += 200.0
        if i % 500 == 7:
            p["adaptive_times_us"][i], p["adaptive_ran"][i] = 1e4, "ring"
    kinds = adapt_bench.judge(p)["excess_by_kind"]
    judged = sum(k[0] for k in kinds.values())
    assert kinds["decision"][0] == 8 and kinds["exploration"][0] == 1  # calls 200-599
    assert kinds["decision"][1] == pytest.approx(8 * 200 / (100 * judged), rel=0.05)
    assert kinds["exploration"][1] == pytest.approx(9900 / (100 * judged), rel=0.05)
    assert abs(kinds["held"][1]) < 0.002


def test_adaptive_blocks_pair_with_their_rounds_fixed_blocks_by_their_saved_starts():
    # the first adaptive block is cut to 7 calls (its key's breaks fall at 7 mod 20);
    # the machine alternates between two levels round by round, every block of a round
    # at its round's level, and the adaptive calls hold the best: paired by their
    # starts each round matches, paired by index each mixes two rounds
    rounds, block = 30, 20
    p = _phase("one_shot", 120.0, rounds=rounds, block=block)
    level = [1.5 if r % 2 else 1.0 for r in range(rounds)]
    for a in ("one_shot", "two_shot"):
        v = p["fixed_times_us"][a]
        p["fixed_times_us"][a] = [t * level[i // block] for i, t in enumerate(v)]
    starts = [0] + list(range(7, 7 + block * (rounds - 1), block))
    sizes = [b - a for a, b in zip(starts, starts[1:] + [starts[-1] + block], strict=True)]
    p["adaptive_times_us"] = [100.0 * level[r] for r, m in enumerate(sizes) for _ in range(m)]
    n = len(p["adaptive_times_us"])
    for k in ("adaptive_choice", "adaptive_ran", "adaptive_waits"):
        p[k] = p[k][:1] * n
    r = adapt_bench.judge({**p, "adaptive_starts": starts})
    assert r["rounds_judged"] == 19 and r["from_call"] == 200  # blocks from call 207 on
    assert abs(r["paired_vs_best"]) < 0.005 and abs(r["median_round_vs_best"]) < 0.005
    assert r["goal_best"]
    # a record without starts is read as whole blocks from its first call
    assert abs(adapt_bench.judge(p)["median_round_vs_best"]) > 0.1


def test_a_run_starts_its_adaptive_blocks_at_the_keys_break_slots(monkeypatch):
    from commlab.testing import run_world

    monkeypatch.syspath_prepend(str(_PATH.parent))  # the spawned ranks import it by name
    monkeypatch.setitem(sys.modules, "adapt_bench", adapt_bench)

    phases = [("small", 4096, False), ("stale", 8192, False)]
    out = run_world(adapt_bench._rank, 2, args=(phases, 1, 30, 25, 19, "cpu"), backend="cpu",
                    env={"COMMLAB_ADAPT": "1"}, timeout=300)[0]
    for p in out:  # a new key each: blocks at its calls 0, 19, 44 (30 calls asked)
        assert p["adaptive_starts"] == [0, 19] and len(p["adaptive_times_us"]) == 44
        assert len(p["fixed_times_us"]["one_shot"]) == 50 and len(p["fixed_times_us"]["ring"]) == 2
    assert out[1]["table"] == "ring"  # the stale phase's table said ring
    assert all(g[0] in ("small", "stale") and g[3] in (0, 1, 2) for p in out for g in p["gc"])
    # the benchmark's own full collection before each phase's timed rounds is logged there
    assert all([p["phase"], adapt_bench._OURS, 2] in [[g[0], g[1], g[3]] for g in p["gc"]]
               for p in out)
    assert all(set(p["tracked_per_call"]) == {"auto", *adapt_bench.ALGS} for p in out)
