"""Rank functions for tests/test_elastic_step.py: a small data-parallel training loop in
``commlab.elastic.step`` that loses a rank and takes in a replacement."""

from __future__ import annotations

import os
import signal
import time

import torch

import commlab
from commlab.elastic import ElasticSampler, State, step
from tests.worlds.elastic import _note

N, BATCH = 160, 2


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = ElasticSampler(N, BATCH, seed=3)
    state = State(model=model, optimizer=opt, sampler=sampler, step=0, seen=[], worlds=[])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 4, generator=g)
    return state, x, x.sum(1, keepdim=True)


def _train(state, x, y, me: str, note_dir: str, kill: tuple, pause: float) -> dict:
    model, opt, sampler = state.model, state.optimizer, state.sampler
    while not state.sampler.done:
        with step(state, grow_timeout=30):
            comm = commlab.get_communicator()
            idx = sampler.next_batch()
            if (me, state.step) == kill:
                _note(note_dir, "killed", time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            loss = ((model(x[idx]) - y[idx]) ** 2).sum()
            loss.backward()
            flat = torch.cat([p.grad.view(-1) for p in model.parameters()])
            flat = commlab.all_reduce(flat)
            mine = torch.full((BATCH,), -1.0)
            mine[: len(idx)] = torch.tensor(idx, dtype=torch.float32)
            every = commlab.all_gather(mine)
            taken = [int(i) for i in every.tolist() if i >= 0]
            off = 0
            for p in model.parameters():
                p.grad.copy_(flat[off: off + p.numel()].view_as(p) / max(len(taken), 1))
                off += p.numel()
            opt.step()
            state.seen = state.seen + taken
            state.worlds = state.worlds + [comm.world_size]
            state.step += 1
            time.sleep(pause)
    comm = commlab.get_communicator()
    params = torch.cat([p.detach().view(-1) for p in model.parameters()])
    every = commlab.all_gather(params)
    return {"rank": comm.rank, "world": comm.world_size, "seen": state.seen,
            "steps": state.step, "worlds": state.worlds,
            "params_equal": bool(all(torch.equal(c, params)
                                     for c in every.view(comm.world_size, -1))),
            "last_sync": state.last_sync, "events": state.events}


def member(comm, note_dir: str, kill: tuple, pause: float = 0.05) -> dict:
    _note(note_dir, f"pid{comm.rank}", os.getpid())
    state, x, y = _setup()
    return _train(state, x, y, f"m{comm.rank}", note_dir, kill, pause)


def replacement(_, note_dir: str, pause: float = 0.05, after: float = 1.0) -> dict:
    """Joins ``after`` s after the kill: the survivors train a while as a smaller world."""
    while not os.path.exists(os.path.join(note_dir, "killed")):
        time.sleep(0.01)
    time.sleep(after)
    commlab.init(join=True, timeout=60)
    _note(note_dir, "pid_new", os.getpid())
    state, x, y = _setup()
    return _train(state, x, y, "new", note_dir, ("none", -1), pause)
