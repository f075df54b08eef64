"""A worker script for tests/test_run.py, started by ``python -m commlab.run``.

    python -m commlab.run --nproc-per-node 4 tests/worlds/launched.py OUT --steps 8 \\
        --victim 2 --at 3 [--grow] [--hang]

Every rank runs ``--steps`` checked all_reduces (step s: rank r gives r + 1 + s). Rank
``--victim`` (its RANK at start) SIGKILLs itself before step ``--at``; the survivors catch
RankLostError, shrink and redo that step (the earliest step any survivor was in).
``--grow``: after the shrink the members call ``commlab.grow(1)`` and the launcher's
replacement (COMMLAB_JOIN=1) is admitted and takes the step count from rank 0.
``--grow-at S``: before step S the members call ``commlab.grow(1)`` (a newcomer started
with COMMLAB_JOIN=1 is admitted).
``--hang``: every rank waits in a loop for a signal (the launcher's forwarded SIGTERM)
and notes it. ``--pace S``: sleep S between steps.
Each worker writes OUT/<pid>.started after init and OUT/<pid>.json at the end.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time

import torch

import commlab


def _write(out: str, record: dict) -> None:
    path = os.path.join(out, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _hang(out: str, rec: dict) -> None:
    def on(sig, frame):
        rec["signal"] = signal.Signals(sig).name
        _write(out, rec)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on)
    _write(out, rec)
    while True:
        time.sleep(0.05)


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung worker's stacks
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--victim", type=int, default=-1)
    p.add_argument("--at", type=int, default=2)
    p.add_argument("--grow", action="store_true")
    p.add_argument("--grow-at", type=int, default=-1)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--pace", type=float, default=0.0, help="seconds between steps")
    a = p.parse_args()
    joined = os.environ.get("COMMLAB_JOIN") == "1"
    comm = commlab.init(backend="cpu")
    rec: dict = {"pid": os.getpid(), "start_rank": int(os.environ["RANK"]), "joined": joined,
                 "steps": [], "lost": [], "sizes": [], "t_killed": None}
    if a.hang:
        _hang(a.out, rec)
    open(os.path.join(a.out, f"{os.getpid()}.started"), "w").close()
    step = 0
    if joined:  # the members' step count: rank 0's, through commlab's own broadcast
        step = int(commlab.broadcast(torch.tensor([-1.0]), src=0)[0])
    while step < a.steps:
        if not joined and rec["start_rank"] == a.victim and step == a.at:
            with open(os.path.join(a.out, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if not joined and step == a.grow_at and "grown" not in rec:
            rec["grown"] = True
            comm = commlab.grow(1, timeout=120)
            commlab.broadcast(torch.tensor([float(step)]), src=0)
            rec["sizes"].append(comm.world_size)
        try:
            w = comm.world_size
            y = commlab.all_reduce(torch.full((7,), float(comm.rank + 1 + step)))
            ok = bool(torch.all(y == w * (w + 1) / 2 + w * step))
            rec["steps"].append([step, w, ok])
            if rec["lost"] and "t_first" not in rec:  # the first collective after a shrink
                rec["t_first"] = time.time()
            step += 1
            time.sleep(a.pace)
        except commlab.RankLostError as e:
            rec["lost"].append(e.lost)
            rec["t_lost"] = time.time()
            comm = commlab.shrink()
            rec["sizes"].append(comm.world_size)
            # a survivor whose part of step s had finished before the loss (a link cut
            # mid-step) is one step ahead: the survivors go on from the earliest
            step = int(commlab.all_reduce(torch.tensor([float(step)]), op="min")[0])
            if a.grow:
                comm = commlab.grow(1, timeout=120)
                commlab.broadcast(torch.tensor([float(step)]), src=0)
                rec["sizes"].append(comm.world_size)
    rec["generation"] = comm.generation
    rec["rank"] = comm.rank
    rec["hosts"] = comm.hosts
    _write(a.out, rec)
    commlab.finalize()


if __name__ == "__main__":
    main()
