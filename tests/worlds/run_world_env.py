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


def last_share_read_late(comm, delay: float) -> dict:
    """Rank 0 (serving the store) shares a value and returns at once; the others read it
    only ``delay`` s later, after rank 0 reached ``finalize``."""
    import time

    if comm.rank != 0:
        time.sleep(delay)
    value = comm.members.share("last", "from rank 0" if comm.rank == 0 else None)
    return {"value": value, "at": time.monotonic()}
