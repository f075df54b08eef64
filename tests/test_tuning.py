"""commlab.tuning: measured winners, the auto table, its cache and fingerprint."""

from __future__ import annotations

import json
import time

import pytest
import torch

from commlab import costmodel, tuning
from commlab.testing import run_world
from commlab.tuning._fingerprint import fingerprint_of
from commlab.tuning._table import TuningTable, auto_violations, winners

# --- rank functions -----------------------------------------------------------------


def tune_world(comm, sizes):
    """tune() on 2 ranks, then what lookup answers, how fast, and after invalidation."""
    import commlab

    table = commlab.tune(sizes=sizes, iters=2, progress=False)
    path = tuning.table_path(comm)
    answers = {n: tuning.lookup(comm, "all_reduce", torch.float32, n) for n in sizes}
    other_dtype = tuning.lookup(comm, "all_reduce", torch.int32, sizes[0])
    batches = []
    for _ in range(50):  # per-call cost of lookup: best of 50 batches (preemption-proof)
        t = time.perf_counter()
        for i in range(1000):
            tuning.lookup(comm, "all_reduce", torch.float32, i)
        batches.append((time.perf_counter() - t) / 1000 * 1e6)
    # auto now runs the table's choice and stays right
    x = torch.randn(257, generator=torch.Generator().manual_seed(comm.rank))
    y = commlab.all_reduce(x)
    # a table for another fingerprint (here: the same file renamed as if for 3 ranks)
    # must not be used: drop the in-memory copy, move our file away, lookup -> defaults
    tuning.forget()
    commlab.barrier()
    if comm.rank == 0:
        stale = json.loads(path.read_text())
        stale["fields"]["world_size"] = 3
        stale["fingerprint"] = fingerprint_of(stale["fields"])
        path.with_name(stale["fingerprint"] + ".json").write_text(json.dumps(stale))
        path.unlink()
    commlab.barrier()
    after = tuning.lookup(comm, "all_reduce", torch.float32, sizes[0])
    return {"entries": table.entries, "fingerprint": table.fingerprint, "path": str(path),
            "answers": answers, "other_dtype": other_dtype, "lookup_us": min(batches),
            "auto_sum": float(y.sum()), "after_invalidation": after,
            "packaged": (tuning.PACKAGED / f"{table.fingerprint}.json").exists()}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tuning")
    return run_world(tune_world, 2, args=([8, 16384],), timeout=300,
                     env={"COMMLAB_TUNING_DIR": str(folder), "COMMLAB_TIMEOUT": "60"})


# --- with a world -------------------------------------------------------------------


def test_tune_picks_the_measured_winner_at_every_size(tuned):
    rows = tuned[0]["entries"]["all_reduce|float32|2"]
    assert [r["bytes"] for r in rows] == [8, 16384]
    for r in rows:
        assert set(r["times_us"]) == {"one_shot", "two_shot", "ring"}
        assert r["algorithm"] == min(r["times_us"], key=r["times_us"].get)
        assert tuned[0]["answers"][r["bytes"]] == r["algorithm"]


def test_every_rank_gets_the_same_table_and_answers(tuned):
    assert tuned[0]["entries"] == tuned[1]["entries"]
    assert tuned[0]["answers"] == tuned[1]["answers"]
    assert tuned[0]["auto_sum"] == pytest.approx(tuned[1]["auto_sum"])


def test_table_is_cached_under_the_fingerprint(tuned):
    fp = tuned[0]["fingerprint"]
    assert fp.startswith("cpu-w2-") and tuned[0]["path"].endswith(f"{fp}.json")


def test_untuned_dtype_falls_back_to_defaults(tuned):
    assert tuned[0]["other_dtype"] is None


def test_lookup_costs_under_two_microseconds(tuned):
    assert tuned[0]["lookup_us"] < 2.0, tuned[0]["lookup_us"]


def test_table_of_another_fingerprint_is_not_used(tuned):
    if tuned[0]["packaged"]:
        pytest.skip("a packaged table exists for this fingerprint: lookup falls back to it")
    assert tuned[0]["after_invalidation"] is None and tuned[1]["after_invalidation"] is None


# --- selection logic on synthetic measurements ------------------------------------


def _synthetic(sizes, world=2):
    """Times from the alpha-beta model: one_shot wins small, two_shot large."""
    consts = {"one_shot": (4.0, 300.0), "two_shot": (5.0, 330.0), "ring": (6.0, 320.0)}
    return {n: {a: costmodel.predict_us(a, al, be, n, world) for a, (al, be) in consts.items()}
            for n in sizes}


def test_auto_is_within_5_percent_of_the_best_at_every_swept_size():
    sizes = [8 << (2 * i) for i in range(14)]
    times = _synthetic(sizes)
    table = TuningTable("fp", {})
    table.set("all_reduce", "bfloat16", 2, times)
    for n, t in times.items():
        chosen = table.choose("all_reduce", "bfloat16", 2, n)
        assert t[chosen] <= 1.05 * min(t.values())
    algos = {table.choose("all_reduce", "bfloat16", 2, n) for n in sizes}
    assert algos == {"one_shot", "two_shot"}


def test_between_swept_sizes_the_nearer_one_on_a_log_scale_decides():
    table = TuningTable("fp", {})
    table.set("all_reduce", "float32", 2, {1024: {"one_shot": 1, "ring": 2},
                                           4096: {"one_shot": 3, "ring": 2}})
    choose = lambda n: table.choose("all_reduce", "float32", 2, n)  # noqa: E731
    assert [choose(n) for n in (1, 1024, 2047, 2049, 4096, 1 << 30)] == \
        ["one_shot", "one_shot", "one_shot", "ring", "ring", "ring"]
    assert table.choose("all_reduce", "float32", 4, 1024) is None


def test_winners_ignore_missing_measurements():
    rows = winners({8: {"one_shot": 5.0, "ring": 0.0}, 16: {}})
    assert rows == [{"bytes": 8, "algorithm": "one_shot", "times_us": {"one_shot": 5.0}}]


def test_fingerprint_changes_with_any_field():
    base = {"backend": "cuda", "world_size": 2, "device": "NVIDIA H200",
            "gpus_per_host": 2, "links": {"topology": "abc"}}
    fps = {fingerprint_of(base)}
    for k, v in (("world_size", 4), ("device", "NVIDIA H100"),
                 ("links", {"topology": "abd"}), ("backend", "cpu")):
        fps.add(fingerprint_of({**base, k: v}))
    assert len(fps) == 5 and fingerprint_of(base).startswith("cuda-w2-nvidia-h200-")


def test_auto_violations_flag_a_slow_auto():
    from commlab.bench._records import Record

    def rec(impl, t):
        return Record.measured(op="all_reduce", impl=impl, dtype="bf16", nbytes=64,
                               world_size=2, time_us=t, device="d", commit="c", mode="graph")
    ok = [rec("commlab:one_shot", 10), rec("commlab:two_shot", 12), rec("commlab:auto", 10.4)]
    bad = ok[:2] + [rec("commlab:auto", 11)]
    assert auto_violations(ok) == [] and "+10%" in auto_violations(bad)[0]


def test_auto_is_judged_by_the_algorithm_it_picks_in_graph_mode():
    from commlab.bench._records import Record

    def rec(impl, t, mode="graph"):
        return Record.measured(op="all_reduce", impl=impl, dtype="bf16", nbytes=64,
                               world_size=2, time_us=t, device="d", commit="c", mode=mode)
    noisy = [rec("commlab:one_shot", 10), rec("commlab:two_shot", 12), rec("commlab:auto", 11)]
    # auto replays one_shot's kernels: its own 10% is noise, the pick is the best
    assert auto_violations(noisy, choice=lambda *a: "one_shot") == []
    wrong = auto_violations(noisy, choice=lambda *a: "two_shot")
    assert len(wrong) == 1 and "auto (runs two_shot) 12.0" in wrong[0] and "+20%" in wrong[0]
    # eager: the lookup's host cost counts, so auto's own time is judged
    eager = [rec(r.impl, r.time_us, "eager") for r in noisy]
    assert "+10%" in auto_violations(eager, choice=lambda *a: "one_shot")[0]


def test_table_round_trips_and_rejects_other_schemas(tmp_path):
    t = TuningTable("fp", {"backend": "cpu"}, meta={"mode": "eager"})
    t.set("all_reduce", "float32", 2, {8: {"ring": 1.0}})
    assert TuningTable.load(t.save(tmp_path / "fp.json")).entries == t.entries
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="schema"):
        TuningTable.load(tmp_path / "bad.json")
