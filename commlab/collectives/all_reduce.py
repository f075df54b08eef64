"""All-reduce: every rank ends with the element-wise reduction of every rank's input.

Three algorithms, one file each: ``one_shot`` (latency; with two ranks, up to mid
sizes), ``two_shot`` (bandwidth) and ``ring`` (neighbour-only traffic, for teaching).
``auto`` picks by size; see _select.
"""

from __future__ import annotations

import torch

from commlab.collectives._host import Collective, run
from commlab.collectives.one_shot_all_reduce import one_shot_all_reduce
from commlab.collectives.ring_all_reduce import ring_all_reduce
from commlab.collectives.two_shot_all_reduce import two_shot_all_reduce
from commlab.runtime.communicator import publishes_local_errors

_IMPLS = {"one_shot": one_shot_all_reduce, "two_shot": two_shot_all_reduce,
          "ring": ring_all_reduce}
ALL_REDUCE = Collective("all_reduce", _IMPLS, params=("op",))


@publishes_local_errors(dispatch=True)
def all_reduce(x: torch.Tensor, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Return the reduction (``op``: "sum", "max", "min") of ``x`` over all ranks.

    ``x`` must have the same shape and dtype on every rank and is not modified. Float
    reductions accumulate in fp32."""
    return run(ALL_REDUCE, x, algorithm, op)
