"""The "commlab" backend's own host cost per dist.all_reduce, on one CPU rank, with
commlab's collective (the backend's runner ``_native.all_reduce_``) replaced by nothing
(so only torch's wrapper and the backend's dispatch are timed), against gloo's whole
call on one rank. ``bench/probes/torch_dist_floor.py --commlab`` times the same beside
torch's own floor.

    COMMLAB_BACKEND=cpu .venv/bin/python bench/torch_backend_layer.py
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("COMMLAB_BACKEND", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1")
os.environ.setdefault("MASTER_PORT", "29611")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import commlab  # noqa: E402, F401  (registers the backend)
from commlab.torch_backend import _native  # noqa: E402


def per_call_us(fn, n: int = 2000, reps: int = 5) -> float:
    for _ in range(50):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main() -> None:
    dist.init_process_group("commlab")
    x = torch.zeros(2)
    dist.all_reduce(x)  # builds the Communicator
    gloo = dist.new_group(backend="gloo")
    pg, opts = dist.group.WORLD, dist.AllreduceOptions()
    kernel = _native.all_reduce_
    _native.all_reduce_ = lambda comm, t, name, algorithm="auto": None  # in place: no kernel
    try:
        rows = {
            "dist.all_reduce via commlab (no kernel)": per_call_us(lambda: dist.all_reduce(x)),
            "the backend's allreduce method alone": per_call_us(lambda: pg.allreduce([x], opts)),
            "dist.all_reduce via gloo (1 rank, whole call)":
                per_call_us(lambda: dist.all_reduce(x, group=gloo)),
        }
    finally:
        _native.all_reduce_ = kernel
    for k, v in rows.items():
        print(f"{k:<48} {v:7.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
