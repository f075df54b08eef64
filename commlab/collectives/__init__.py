"""Collectives: one op per file, each a Triton kernel over the symmetric heap plus a
host wrapper that checks arguments on every rank, stages the input and launches."""

from commlab.collectives import _cpu_all_reduce, _cpu_moves  # noqa: F401  (register host twins)
from commlab.collectives.all_gather import all_gather
from commlab.collectives.all_reduce import all_reduce
from commlab.collectives.all_to_all import all_to_all
from commlab.collectives.barrier import barrier
from commlab.collectives.broadcast import broadcast
from commlab.collectives.reduce_scatter import reduce_scatter

__all__ = ["all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "reduce_scatter"]
