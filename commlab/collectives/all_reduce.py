"""All-reduce: every rank ends with the element-wise reduction of every rank's input.

Three algorithms, one file each: ``one_shot`` (latency; with two ranks, every size),
``two_shot`` (bandwidth beyond two ranks) and ``ring`` (neighbour-only traffic, for
teaching). ``auto`` picks by size; see _select.
"""

from __future__ import annotations

import torch

from commlab.collectives._common import OPS, agree, check_local, comm_or_raise, launch_for, traced
from commlab.collectives._plan import Plan, aligned
from commlab.collectives._select import choose_all_reduce
from commlab.collectives.one_shot_all_reduce import (
    one_shot_all_reduce,
    one_shot_capacity,
)
from commlab.collectives.ring_all_reduce import ring_all_reduce
from commlab.collectives.two_shot_all_reduce import two_shot_all_reduce
from commlab.runtime._control import Signature

_IMPLS = {"one_shot": one_shot_all_reduce, "two_shot": two_shot_all_reduce,
          "ring": ring_all_reduce}


def all_reduce(x: torch.Tensor, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Return the reduction (``op``: "sum", "max", "min") of ``x`` over all ranks.

    ``x`` must have the same shape and dtype on every rank and is not modified. Float
    reductions accumulate in fp32."""
    comm = comm_or_raise()
    plan = comm.plans.get(("all_reduce", x.shape, x.dtype, x.device, op, algorithm)) \
        if isinstance(x, torch.Tensor) else None
    if plan is not None and plan.compiled is not None and x.is_contiguous():
        # --- fast path: same call as before; signature cached, kernel compiled
        comm.control.agree(plan.sig, plan.raw)
        out = torch.empty_like(x)
        if aligned(x, out):
            with traced("all_reduce", plan.nbytes, plan.algorithm, comm.device):
                plan.compiled[plan.grid](x, out, *plan.tail)
            return out
        _run(comm, plan.algorithm, x, out, op, plan.nbytes)
        return out
    err = check_local("all_reduce", comm, x, reduce_op=op, algorithm=algorithm)
    call = agree("all_reduce", x, err, op=op, algorithm=algorithm)
    x = call.x.contiguous()
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    nbytes = x.numel() * x.element_size()
    algo = choose_all_reduce(comm, x.dtype, nbytes) if algorithm == "auto" else algorithm
    compiled = _run(comm, algo, x, out, op, nbytes)
    _remember(comm, call, x, op, algorithm, algo, nbytes, compiled)
    return out


def _run(comm, algo, x, out, op, nbytes):
    with traced("all_reduce", nbytes, algo, comm.device):
        return _IMPLS[algo](comm, x.view(-1), out.view(-1), OPS[op])


def _remember(comm, call, x, op, algorithm, algo, nbytes, compiled) -> None:
    """Cache a plan for single-launch one-shot calls on CUDA (the latency-bound case)."""
    if comm.backend != "cuda" or algo != "one_shot" or compiled is None:
        return
    n = x.numel()
    cap = one_shot_capacity(comm, x.element_size())
    if n > cap:
        return
    cfg = launch_for(comm, n)
    scratch = comm.scratch(2 * comm.world_size * cap * x.element_size(), x.dtype)
    fields = {"shape": tuple(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
              "op": op, "algorithm": algorithm}
    sig = Signature("all_reduce", fields)
    plan = Plan(sig, sig.encode(), algo, nbytes, compiled, (cfg.programs, 1, 1),
                (scratch, comm.context, n, cap, OPS[op], cfg.block))
    comm.plans[("all_reduce", x.shape, x.dtype, x.device, op, algorithm)] = plan
