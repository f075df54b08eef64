"""What a rank of ``commlab.testing.run_world`` sees of its caller (tests/test_run_world.py)."""

from __future__ import annotations

import os

import torch

import commlab


def seen(comm, name: str) -> dict:
    total = commlab.all_reduce(torch.ones(4)).tolist()
    return {"value": os.environ.get(name), "cwd": os.getcwd(), "pid": os.getpid(),
            "ppid": os.getppid(), "sum": total, "rank": comm.rank}


def records_on(comm) -> dict:
    from commlab import language
    from commlab.runtime import records

    return {"host": records.enabled(), "kernels": bool(language.RECORDS.value),
            "ppid": os.getppid()}
