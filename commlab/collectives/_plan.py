"""Launch plans: what a repeated collective call needs, computed once.

The first call with a given (op, shape, dtype, parameters) validates everything, agrees
with the other ranks, picks the algorithm and compiles the kernel. If that call was a
single launch on CUDA, it leaves a Plan: the encoded agreement signature and the
compiled kernel with every argument but the input and output bound. Later identical
calls only publish the cached signature, allocate the output and launch — a few Python
calls, which is what makes small eager collectives cheap. Plans live on the
Communicator and die with it. The CPU backend never makes plans (the interpreter's own
cost dwarfs this).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commlab.collectives._common import traced
from commlab.runtime._control import Signature


@dataclass
class Plan:
    sig: Signature
    raw: bytes
    algorithm: str
    nbytes: int
    compiled: object  # triton CompiledKernel
    grid: tuple
    tail: tuple  # kernel arguments after (x, out), constexprs included
    make_out: Callable[[torch.Tensor], torch.Tensor]
    slow: Callable[[torch.Tensor, torch.Tensor], object]  # the ordinary path


def fast_call(comm, key: tuple, x) -> torch.Tensor | None:
    """Run the cached plan for ``key`` if there is one; None means "take the slow path"."""
    try:
        plan = comm.plans.get(key)
    except TypeError:  # an unhashable parameter (op=["sum"]): the checks will refuse it
        return None
    if plan is None or not x.is_contiguous():
        return None
    comm.control.agree(plan.sig, plan.raw)
    out = plan.make_out(x)
    with traced(plan.sig.op, plan.nbytes, plan.algorithm, comm.device):
        if x.data_ptr() % 16 or out.data_ptr() % 16:  # not what the kernel was built for
            plan.slow(x, out)
        else:
            plan.compiled[plan.grid](x, out, *plan.tail)
    return out


def remember(comm, key: tuple | None, call, *, algorithm: str, nbytes: int, launched: list,
             make_out, slow) -> None:
    """Keep a plan after a slow-path call that made exactly one CUDA launch.

    ``launched`` holds (compiled, grid, args, consts) of every launch the call made."""
    if key is None or comm.backend != "cuda" or len(launched) != 1 or call.sig is None or call.sig.error:
        return
    compiled, grid, args, consts = launched[0]
    if compiled is None:
        return
    comm.plans[key] = Plan(call.sig, call.sig.encode(), algorithm, nbytes, compiled,
                           (tuple(grid) + (1, 1))[:3], tuple(args[2:]) + tuple(consts.values()),
                           make_out, slow)
