"""Functions the client runs on a world's ranks (importable without IPython)."""

from __future__ import annotations

from commlab.runtime import get_communicator
from commlab.topology import linkbench
from commlab.topology._world import rank_info

SHM_PROBE_BYTES = 1 << 20  # one size is enough to label shared-memory edges


def call_with_comm(fn, *args, **kwargs):
    """For ``World.apply``: call ``fn(comm, ...)`` with this rank's communicator."""
    return fn(get_communicator(), *args, **kwargs)


def probe(comm, with_bench: bool = True) -> dict:
    """What ``%topology`` needs from a rank: its info, plus a one-size memcpy linkbench
    row on the CPU backend (shared-memory edges get a measured bandwidth)."""
    out = {"info": rank_info(comm)}
    if with_bench and comm.backend == "cpu":
        out["row"] = linkbench.rank_run(comm, (SHM_PROBE_BYTES,), 3, ("memcpy",))
    return out


def bench_and_info(comm, sizes, iters, methods, progress=None) -> dict:
    """A full linkbench row plus rank info (for a temporary world: one start, both)."""
    return {"info": rank_info(comm),
            "row": linkbench.rank_run(comm, sizes, iters, methods, progress)}


def probe_with_queue(comm, progress=None) -> dict:
    """``probe`` with the progress queue a temporary world passes (unused: one size)."""
    return probe(comm)
