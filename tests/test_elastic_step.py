"""``commlab.elastic``: State commits and rolls back, ElasticSampler re-splits an epoch when
the world changes, and ``step`` carries a training loop through a lost rank and a
replacement with no sample lost or seen twice."""

from __future__ import annotations

import os

import torch

from commlab.elastic import ElasticSampler, State
from commlab.testing import run_world
from tests.test_faults import assert_nothing_left
from tests.worlds.elastic_step import N, member, replacement


def _step(s: ElasticSampler, world: int) -> list[list[int]]:
    """One step of every rank of a world (each rank's sampler holds the same position)."""
    before = s.state_dict()
    parts = []
    for r in range(world):
        s.load_state_dict(before)
        parts.append(s.next_batch(r, world))
    return parts


def test_sampler_resplits_the_remaining_samples_so_an_epoch_sees_each_once():
    s = ElasticSampler(103, batch_size=4, seed=5)
    seen: list[int] = []
    for world in [4, 4, 3, 3, 5, 2] + [4] * 20:  # shrinks and grows between steps
        if s.done:
            break
        parts = _step(s, world)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        seen += [i for p in parts for i in p]
    assert s.done and sorted(seen) == list(range(103))
    rolled = ElasticSampler(103, batch_size=4, seed=5)
    rolled.load_state_dict({**s.state_dict(), "consumed": 16})
    assert rolled.next_batch(0, 2) == s.order()[16:20].tolist()  # a rollback takes them again


def test_state_restore_rolls_back_model_optimizer_tensors_and_values():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    t = torch.zeros(4)
    state = State(model=model, optimizer=opt, t=t, step=3, seen=[1])
    w0 = model.weight.detach().clone()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    t += 1
    state.step += 1
    state.seen = state.seen + [2]
    assert not torch.equal(model.weight, w0) and state.step == 4
    state.restore()
    assert torch.equal(model.weight, w0) and torch.equal(t, torch.zeros(4))
    assert state.step == 3 and state.seen == [1] and opt.state_dict()["state"] == {}


def test_a_lost_rank_is_rolled_back_and_a_replacement_trains_with_no_sample_lost(tmp_path):
    d = str(tmp_path)
    res = run_world(member, 4, kwargs={"note_dir": d, "kill": ("m2", 5)}, store="parent",
                    timeout=240, env={"COMMLAB_TIMEOUT": "60", "COMMLAB_PEER_TIMEOUT": "1"},
                    allow_killed=True, newcomers=[(replacement, {"note_dir": d})])
    assert res[2] is None
    live = [r for r in res if r is not None]
    assert sorted(r["rank"] for r in live) == [0, 1, 2, 3]
    for r in live:
        assert sorted(r["seen"]) == list(range(N)), r  # each sample once, none lost
        assert r["steps"] == len(r["worlds"]) and r["params_equal"], r
        assert r["worlds"] == live[0]["worlds"] and r["seen"] == live[0]["seen"]
    worlds = live[0]["worlds"]
    print("worlds per step", worlds, "state bytes", res[4]["last_sync"])
    assert worlds[:5] == [4] * 5 and 3 in worlds and worlds[-1] == 4  # shrank, then grew
    assert res[4]["last_sync"]["bytes"] > 0
    pids = [int(open(os.path.join(d, n)).read()) for n in os.listdir(d) if n.startswith("pid")]
    assert_nothing_left(pids)
