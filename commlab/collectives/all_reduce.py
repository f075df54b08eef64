"""All-reduce: every rank ends with the element-wise reduction of every rank's input.

Three algorithms, one file each: ``one_shot`` (latency; with two ranks, up to mid
sizes), ``two_shot`` (bandwidth) and ``ring`` (neighbour-only traffic, for teaching).
``auto`` picks by size; see _select.
"""

from __future__ import annotations

import torch

from commlab.collectives._common import OPS, agree, check_local, comm_or_raise, traced
from commlab.collectives._plan import fast_call, remember
from commlab.collectives._select import choose_all_reduce
from commlab.collectives.one_shot_all_reduce import one_shot_all_reduce
from commlab.collectives.ring_all_reduce import ring_all_reduce
from commlab.collectives.two_shot_all_reduce import two_shot_all_reduce

_IMPLS = {"one_shot": one_shot_all_reduce, "two_shot": two_shot_all_reduce,
          "ring": ring_all_reduce}


def all_reduce(x: torch.Tensor, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Return the reduction (``op``: "sum", "max", "min") of ``x`` over all ranks.

    ``x`` must have the same shape and dtype on every rank and is not modified. Float
    reductions accumulate in fp32."""
    comm = comm_or_raise()
    key = None
    if isinstance(x, torch.Tensor):
        key = ("all_reduce", x.shape, x.dtype, x.device, op, algorithm)
        out = fast_call(comm, key, x)
        if out is not None:
            return out
    err = check_local("all_reduce", comm, x, reduce_op=op, algorithm=algorithm)
    call = agree("all_reduce", x, err, op=op, algorithm=algorithm)
    x = call.x.contiguous()
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    nbytes = x.numel() * x.element_size()
    algo = choose_all_reduce(comm, x.dtype, nbytes) if algorithm == "auto" else algorithm
    impl, code = _IMPLS[algo], OPS[op]
    launched: list = []
    with traced("all_reduce", nbytes, algo, comm.device):
        impl(comm, x.view(-1), out.view(-1), code, launched)
    remember(comm, key, call, algorithm=algo, nbytes=nbytes, launched=launched,
             make_out=torch.empty_like,
             slow=lambda a, b: impl(comm, a.view(-1), b.view(-1), code))
    return out
