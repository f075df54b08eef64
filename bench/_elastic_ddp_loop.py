"""The DDP loop ``bench/elastic_vs_torchrun.py`` runs, once per recovery strategy.

    torchrun --nproc-per-node 4 --max-restarts 1 bench/_elastic_ddp_loop.py OUT --mode restart
    python -m commlab.run --nproc-per-node 4 bench/_elastic_ddp_loop.py OUT --mode shrink

A small MLP in ``DistributedDataParallel``; each step draws its batch from (step, rank).
Rank ``--victim`` SIGKILLs itself before step ``--kill-at`` (first life only) and notes
the time. ``restart``: torchrun's way, DDP on gloo; rank 0 checkpoints after every step
(the best case for a restart) and a restarted world loads it. ``shrink``: commlab's way,
``commlab.init()`` made the gloo group and DDP's gradient buckets go through a comm hook
calling ``commlab.all_reduce`` (gloo's own all_reduce waits on a dead peer until its
timeout); a failed step raises RankLostError, the survivors ``commlab.shrink()`` (a new
default group), wrap the model in a new DDP and redo the step. After the event every rank
times its first all_reduce that checks (the world size) and writes OUT/<pid>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH = 256


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, 1))


def _step(ddp: DDP, opt: torch.optim.Optimizer, step: int, rank: int) -> float:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, WIDTH, generator=g)
    loss = ((ddp(x) - x.sum(1, keepdim=True).tanh()) ** 2).mean()
    opt.zero_grad()
    loss.backward()  # DDP's bucket all_reduces
    opt.step()
    return float(loss.detach())


def _commlab_hook(state, bucket):
    """DDP's bucket all_reduce through commlab (mean over the ranks)."""
    import commlab

    buf = bucket.buffer()
    buf.copy_(commlab.all_reduce(buf) / dist.get_world_size())
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _ddp(model: torch.nn.Module, mode: str) -> DDP:
    ddp = DDP(model)
    if mode == "shrink":
        ddp.register_comm_hook(None, _commlab_hook)
    return ddp


def _rewrap(model: torch.nn.Module, opt: torch.optim.Optimizer, mode: str):
    """A fresh module and optimizer with the same state in a new DDP over the current
    group (the old DDP's autograd hooks stay on the old parameters)."""
    fresh = _model()
    fresh.load_state_dict(model.state_dict())
    new_opt = torch.optim.SGD(fresh.parameters(), lr=0.01)
    new_opt.load_state_dict(opt.state_dict())
    return fresh, new_opt, _ddp(fresh, mode)


def _checked() -> float:
    """The first collective after an event: an all_reduce whose result is checked."""
    y = torch.ones(1024)
    dist.all_reduce(y)
    assert torch.all(y == dist.get_world_size()), y[:4]
    return time.time()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--mode", choices=["restart", "shrink"], required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=10)
    p.add_argument("--join", action="store_true", help="shrink, then admit a replacement")
    a = p.parse_args()
    t_start = time.time()
    life = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    start_rank = int(os.environ["RANK"])
    if a.mode == "shrink":
        import commlab

        commlab.init(backend="cpu")  # torch.distributed's gloo group, on the launcher's store
    else:  # torchrun's agent store, under a prefix per life: keys of the dead life stay in it
        from datetime import timedelta

        agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=dist.PrefixStore(f"bench/life{life}", agent),
                                rank=start_rank, world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    model, step = _model(), 0
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = os.path.join(a.out, "ckpt.pt")
    rec: dict = {"pid": os.getpid(), "mode": a.mode, "life": life, "start_rank": start_rank,
                 "t_start": t_start, "steps": [], "t_ok": None}
    if a.mode == "restart" and life > 0:  # torchrun started every worker again
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"] + 1
        rec["t_loaded"] = time.time()
        rec["t_ok"] = _checked()
    if os.environ.get("COMMLAB_JOIN") == "1":  # a replacement, admitted by commlab.grow
        import commlab

        rec["joined"] = True
        step = int(commlab.broadcast(torch.tensor([0], dtype=torch.int32), src=0)[0])
        rec["join_bytes"] = 4 + sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = _ddp(model, a.mode)  # DDP broadcasts rank 0's parameters: a newcomer's come here
    if rec.get("joined"):
        rec["t_ok"] = _checked()
    step_s = []
    while step < a.steps:
        if life == 0 and start_rank == a.victim and step == a.kill_at and \
                not os.environ.get("COMMLAB_JOIN"):
            with open(os.path.join(a.out, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        try:
            loss = _step(ddp, opt, step, rank)
        except Exception as e:  # noqa: BLE001 - a peer died inside DDP's all_reduce
            if a.mode != "shrink":
                raise
            import commlab

            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rec["t_error"] = time.time()
            comm = commlab.shrink()  # the survivors, renumbered; a new default group
            rec["t_shrunk"] = time.time()
            model, opt, ddp = _rewrap(model, opt, a.mode)  # broadcasts rank 0's parameters
            rec["t_ok"] = _checked()
            if a.join:  # the launcher's replacement is admitted; it needs the step count
                comm = commlab.grow(1, timeout=120)
                commlab.broadcast(torch.tensor([step], dtype=torch.int32), src=0)
                model, opt, ddp = _rewrap(model, opt, a.mode)
                rec["t_ok_grown"] = _checked()
            rank = comm.rank
            continue  # the failed step again: no optimizer step was taken
        step_s.append(time.perf_counter() - t0)
        if rec.get("joined") and "t_joined" not in rec:
            rec["t_joined"] = time.time()  # the newcomer's first step done
        rec["steps"].append([step, dist.get_world_size(), loss])
        if a.mode == "restart" and rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        step += 1
    rec["step_ms_median"] = 1000 * sorted(step_s)[len(step_s) // 2] if step_s else None
    rec["world_end"] = dist.get_world_size()
    with open(os.path.join(a.out, f"{os.getpid()}.json"), "w") as f:
        json.dump(rec, f)
    if a.mode == "shrink":
        import commlab

        commlab.finalize()
    else:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
