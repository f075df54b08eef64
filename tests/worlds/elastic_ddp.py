"""Rank function for tests/test_elastic.py: a DDP loop on the "commlab" torch backend
that loses a rank, shrinks and goes on with correct gradients."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import commlab
from tests.worlds.elastic import _die, _note


def _net() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(),
                               torch.nn.Linear(12, 1))


def _batch(step: int, origin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``origin``'s batch of step ``step`` (any rank can compute any rank's)."""
    g = torch.Generator().manual_seed(1000 * step + origin)
    return torch.randn(5, 6, generator=g), torch.randn(5, 1, generator=g)


def _reference(net: torch.nn.Module, step: int, members: list[int]) -> list[torch.Tensor]:
    """The gradient DDP must produce: the mean over ``members`` of each one's gradient,
    computed here on a copy."""
    grads = []
    for m in members:
        twin = _net()
        twin.load_state_dict(net.state_dict())
        x, y = _batch(step, m)
        F.mse_loss(twin(x), y).backward()
        grads.append([p.grad for p in twin.parameters()])
    return [torch.stack(g).mean(0) for g in zip(*grads, strict=True)]


def ddp_shrink_world(_, note_dir: str, victim: int, kill_step: int, steps: int) -> dict:
    """torch.distributed on "commlab" through the launcher's store (as under torchrun);
    rank ``victim`` dies at the start of step ``kill_step``, so every survivor's backward
    of that step fails in DDP's all-reduce; each survivor shrinks, wraps the model in DDP
    again and redoes the step. Every step's gradients are checked against ``_reference``."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("commlab", store=dist.PrefixStore("ddp", store), rank=rank,
                            world_size=world)
    commlab.init()
    _note(note_dir, f"pid{rank}", os.getpid())
    net = _net()
    model, opt = DDP(net), torch.optim.SGD(net.parameters(), lr=0.05)
    old_group = dist.group.WORLD
    members, out = list(range(world)), {"errors": [], "steps": []}
    step = 0
    while step < steps:
        if rank == victim and step == kill_step:
            _die(note_dir, rank)
        x, y = _batch(step, rank)
        opt.zero_grad()
        try:
            F.mse_loss(model(x), y).backward()
        except Exception as e:  # noqa: BLE001 - what DDP raises for a lost rank, recorded
            out["errors"].append({"type": type(e).__name__, "text": str(e),
                                  "lost_error": isinstance(e, commlab.RankLostError)})
            new = commlab.shrink()
            members = list(new.members.origin)
            try:  # the group DDP held is retired: its calls (DDP's reducer makes them
                # on the group itself) say what to do
                old_group.allreduce([torch.ones(1)])
                out["retired"] = "no error"
            except commlab.CommlabUsageError as r:
                out["retired"] = str(r)
            model = DDP(net)  # over dist.group.WORLD: the survivors
            out["after"] = {"rank": dist.get_rank(), "world": dist.get_world_size(),
                            "comm_rank": new.rank}
            continue  # the failed step again, on the survivors (nobody stepped)
        ref = _reference(net, step, members)
        ok = all(torch.allclose(p.grad, r, atol=1e-6) for p, r in
                 zip(net.parameters(), ref, strict=True))
        out["steps"].append({"step": step, "world": len(members), "ok": ok})
        opt.step()
        step += 1
    out["members"] = members
    out["params"] = [p.detach().clone() for p in net.parameters()]
    return out
