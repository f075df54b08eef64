"""gpu_shared_suite.py's torch integration checks: the "commlab" torch.distributed backend
training with DDP (a world started with ``run_world(..., init=False)``), and a
``%%distributed`` cell from a real IPython shell (in the driver's process).
"""

from __future__ import annotations

import os
import re
import time

import torch
import torch.distributed as dist
from _shared_suite_common import Tally

STEPS = 5


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _batch(seed: int, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 7919 + rank * 131 + step)  # data differs per rank
    return torch.randn(6, 16, generator=g), torch.randn(6, 8, generator=g)


def _step(model, opt, x, y) -> None:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def ddp_world(comm, seed: int, backend: str) -> dict:
    """DDP on torch.distributed's "commlab" backend (CUDA: "cpu:gloo,cuda:commlab") next
    to the same loop on gloo over CPU copies; parameters compared after every step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import commlab

    rank = int(os.environ["RANK"])
    t = Tally(rank, "torch backend")
    if backend == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dist.init_process_group("cpu:gloo,cuda:commlab")
    else:
        dev = torch.device("cpu")
        dist.init_process_group("commlab")
    gloo = dist.new_group(backend="gloo")
    with t.check("torch backend: init_process_group and a gloo reference group"):
        assert dist.get_world_size() == int(os.environ["WORLD_SIZE"])
        c = commlab.init()
        assert c.backend == backend, c.backend
    model = DDP(_mlp(seed).to(dev), bucket_cap_mb=0.001)  # several buckets per step
    ref = DDP(_mlp(seed), process_group=gloo, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    commlab.trace.start()
    for step in range(STEPS):
        x, y = _batch(seed, rank, step)
        with t.check(f"torch backend: DDP step {step + 1} parameters match gloo's"):
            _step(model, opt, x.to(dev), y.to(dev))
            _step(ref, ref_opt, x, y)
            for i, (p, q) in enumerate(zip(model.parameters(), ref.parameters(), strict=True)):
                try:
                    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
                except AssertionError as e:
                    raise AssertionError(f"parameter {i} {tuple(p.shape)}: {e}") from None
    spans = commlab.trace.stop()
    with t.check("torch backend: DDP's bucket all-reduces ran on commlab's kernels"):
        comm_spans = [s for s in spans if s.kind == "comm" and s.name == "all_reduce"]
        assert len(comm_spans) >= STEPS, f"{len(comm_spans)} commlab all_reduce spans"
    # free the Reducers while the groups are referenced, let gloo's threads drop their
    # works (tests/worlds/torch_backend.py: a deadlock inside torch otherwise)
    del model, ref
    time.sleep(0.1)
    dist.destroy_process_group()
    return t.result()


def check_magic(t: Tally, ranks: int, backend: str) -> None:
    """``%dist_start -n N --backend B``, a %%distributed all_reduce cell, ``%dist_stop``,
    from ``InteractiveShell.instance()`` in this process; skipped without ipyparallel."""
    try:
        import ipyparallel  # noqa: F401
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
    except ImportError as e:
        t.skip("%%distributed cell", f"the notebook extras are missing ({e}); carry them "
               "as wheels in .whl/ (bench/gpu_shared.sh installs them)")
        return
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "commlab")
    started = False
    try:
        with t.check(f"%dist_start -n {ranks} --backend {backend}"):
            with capture_output() as cap:
                ip.run_line_magic("dist_start", f"-n {ranks} --backend {backend}")
            started = True
            print("  " + cap.stdout.strip().replace("\n", "\n  "), flush=True)
        if not started:
            return
        want = float(ranks * (ranks + 1) // 2)
        with t.check("%%distributed cell: all_reduce printed on every rank"):
            with capture_output() as cap:
                ip.run_cell_magic("distributed", "--timeout 120", (
                    "x = torch.full((4099,), float(rank + 1), device=comm.device)\n"
                    "y = commlab.all_reduce(x)\n"
                    "print('sum', y[:2].tolist(), comm.backend, bool((y == y[0]).all()))\n"))
            line = f"sum [{want}, {want}] {backend} True"
            said = _ranks_saying(cap.stdout, line)
            assert said == set(range(ranks)), \
                f"expected {line!r} from every rank, got it from {sorted(said)}:\n{cap.stdout}"
    finally:
        if started:
            with t.check("%dist_stop"):
                with capture_output():
                    ip.run_line_magic("dist_stop", "")


def _ranks_saying(out: str, line: str) -> set[int]:
    """The ranks whose output holds ``line``: ``[rank 2] line``, ``[ranks 0, 1] line`` or
    ``[ranks 0-3] line`` (identical lines are grouped; on a loaded machine not always)."""
    said: set[int] = set()
    for m in re.finditer(r"^\[ranks? ([0-9, -]+)\] (.*)$", out, re.M):
        if m.group(2).strip() != line:
            continue
        for part in m.group(1).split(","):
            lo, _, hi = part.strip().partition("-")
            said.update(range(int(lo), int(hi or lo) + 1))
    return said
