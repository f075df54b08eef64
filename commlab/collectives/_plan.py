"""Launch plans: what a repeated collective call needs, computed once.

The first call with a given (op, shape, dtype, parameters) validates everything, agrees
with the other ranks, picks the algorithm and compiles the kernel. It leaves a Plan: the
encoded agreement signature, the algorithm and, when the call was a single launch on
CUDA, the compiled kernel with every argument but the input and output bound (otherwise
the plan runs the op's body, as on the CPU backend). Later identical calls only publish
the cached signature, allocate the output and launch — a few Python calls, which is what
makes small eager collectives cheap — and a call repeating the previous one does not wait
for the other ranks (``commlab.runtime._ahead``). Plans live on the Communicator and die
with it; ``COMMLAB_FAST_LAUNCH=0`` makes none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commlab import _config
from commlab.collectives._common import traced
from commlab.runtime import records as _records
from commlab.runtime._control import Signature


@dataclass
class Plan:
    sig: Signature
    raw: bytes
    algorithm: str
    nbytes: int
    compiled: object  # triton CompiledKernel, or None: run ``slow``
    grid: tuple
    tail: tuple  # kernel arguments after (x, out), constexprs included
    make_out: Callable[[torch.Tensor], torch.Tensor]
    slow: Callable[[torch.Tensor, torch.Tensor], object]  # the ordinary path


def fast_call(comm, key: tuple, x, out=None) -> torch.Tensor | None:
    """Run the cached plan for ``key`` if there is one (into ``out`` when given); None
    means "take the slow path"."""
    try:
        plan = comm.plans.get(key)
    except TypeError:  # an unhashable parameter (op=["sum"]): the checks will refuse it
        return None
    if plan is None or not x.is_contiguous():
        return None
    comm.control.agree(plan.sig, plan.raw, ahead=True)
    if out is None:
        out = plan.make_out(x)
    with traced(plan.sig.op, plan.nbytes, plan.algorithm, comm.device, x, comm):
        _launch(plan, x, out)
    return out


def _launch(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> None:
    if plan.compiled is None or x.data_ptr() % 16 or out.data_ptr() % 16:
        plan.slow(x, out)  # no single kernel, or not the alignment it was built for
    else:
        plan.compiled[plan.grid](x, out, *plan.tail)  # type: ignore[index]
        _records.launched()  # a plan's one launch is an SM kernel: it writes a record


def _drain(comm, plan: Plan, shape, dtype) -> None:
    """The plan's kernel on zeros: a peer that ran this call ahead needs its partner."""
    x = torch.zeros(shape, dtype=dtype, device=comm.device)
    _launch(plan, x, plan.make_out(x))


def remember(comm, key: tuple | None, call, *, algorithm: str, nbytes: int, launched: list,
             make_out, slow) -> None:
    """Keep a plan after a slow-path call every rank agreed on; with its compiled kernel
    when the call made exactly one CUDA launch.

    ``launched`` holds (compiled, grid, args, consts) of every launch the call made."""
    if key is None or call.sig is None or call.sig.error or not _config.get("COMMLAB_FAST_LAUNCH"):
        return
    compiled, grid, tail = None, (), ()
    if comm.backend == "cuda" and len(launched) == 1 and launched[0][0] is not None:
        compiled, grid, args, consts = launched[0]
        grid, tail = (tuple(grid) + (1, 1))[:3], tuple(args[2:]) + tuple(consts.values())
    plan = Plan(call.sig, call.sig.encode(), algorithm, nbytes, compiled, grid, tail,
                make_out, slow)
    comm.plans[key] = plan
    shape, dtype = key[1], key[2]
    comm.control.ahead.allow(plan.raw, lambda: _drain(comm, plan, shape, dtype))
