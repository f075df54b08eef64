"""The one host path every collective takes: check, agree, choose, trace, launch, remember.

An op is its kernels plus a ``Collective`` naming its bodies (one per algorithm), the
parameters every rank must agree on and its shape rule; its public function is
``run(OP, x, algorithm, *params)``:

    cached plan for (op, shape, dtype, device, params, algorithm)?  -> publish, launch
    check x and the parameters on this rank (the first broken rule, or "")
    agree with every rank (a local error or a mismatch raises on every rank)
    algorithm "auto" -> _select.choose;  body(comm, x, out, *args, record) under a span
    a call that made one CUDA launch leaves a plan (_plan.remember)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import commlab.collectives._across as _across
import commlab.collectives._adapt as _adapt
from commlab.collectives._common import OPS, agree, check_local, traced
from commlab.collectives._plan import fast_call, remember
from commlab.collectives._select import capturing_auto, choose
from commlab.runtime.communicator import get_communicator


def same_shape(world: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The output is shaped like the input (all_reduce, all_to_all, broadcast)."""
    return torch.empty_like


@dataclass(frozen=True, eq=False)
class Collective:
    """What the host path needs to know about one op.

    ``bodies``: algorithm -> ``body(comm, x, out, *args, record=None)`` with ``x`` and
    ``out`` flat and contiguous; ``args`` are the ``params`` in order, a reduction
    ``op`` as its kernel code. ``params``: keyword parameters agreed across ranks,
    "op" (reduction: "sum", "max", "min") or "src" (a rank). ``shape_rule(x, world)``:
    the broken rule's text, or "". ``output(world)``: makes the output from the input.
    ``capture_choice``: "auto" chooses afresh inside a CUDA-graph capture (no plan)."""

    name: str
    bodies: dict[str, Callable]
    params: tuple[str, ...] = ()
    shape_rule: Callable[[torch.Tensor, int], str] | None = None
    output: Callable[[int], Callable[[torch.Tensor], torch.Tensor]] = same_shape
    capture_choice: bool = False

    @property
    def algorithms(self) -> tuple[str, ...]:
        return ("auto", *self.bodies)


def run(coll: Collective, x, algorithm: str = "auto", *params, out=None) -> torch.Tensor:
    """Run ``coll`` on ``x`` on every rank; ``params`` in ``coll.params``' order. ``out``
    (the torch backend's): a contiguous tensor of the output's dtype and size to write
    instead of a new one; the caller checked that and that it may alias ``x``."""
    comm = get_communicator()
    if _across.spans_hosts(comm):  # commlab inside each host, torch.distributed between
        y = _across.run(coll.name, x, algorithm, *params)
        return y if out is None else out.view(y.shape).copy_(y)
    key: tuple | None = None
    asked = algorithm
    online: dict = {}
    fence = False
    budget = None
    adapting = algorithm == "auto" and _adapt.on(comm)
    if adapting:  # online selection: every rank runs this
        picked, fence, budget = _adapt.pick(comm, coll.name, x, tuple(coll.bodies))
        if picked is not None:
            algorithm, online = picked, {"online": picked}
    if isinstance(x, torch.Tensor):
        key = (coll.name, x.shape, x.dtype, x.device, *params, algorithm)
        if not (fence or coll.capture_choice and capturing_auto(comm, algorithm)):
            # an online pick's call form goes to the C dispatch only with its key's budget
            y = fast_call(comm, key, x, out, dispatch=not adapting or budget is not None,
                          budget=budget)
            if y is not None:
                return y
    fields = dict(zip(coll.params, params, strict=True))
    err = check_local(comm, x, algorithm, coll.algorithms, fields, coll.shape_rule)
    # an online pick is agreed as its own field: calls running different kernels never
    # publish the same signature, so none runs ahead as a repeat of another (_adapt)
    call = agree(coll.name, x, err, **fields, algorithm=asked, **online)
    x = call.x.contiguous()
    make_out = coll.output(comm.world_size)
    if out is None:
        out = make_out(x)
    if x.numel() == 0:
        return out
    # the total size, as nccl-tests counts it: all_gather's output, reduce_scatter's input
    nbytes = max(x.numel(), out.numel()) * x.element_size()
    if algorithm == "auto":
        algorithm = choose(comm, coll.name, x.dtype, nbytes, tuple(coll.bodies))
    body = coll.bodies[algorithm]
    args = tuple(OPS[v] if k == "op" else v for k, v in fields.items())
    if fence:  # another algorithm than this key's previous call: every rank agreed on it
        _adapt.fence(comm)
    launched: list = []
    with traced(coll.name, nbytes, algorithm, comm.device, x, comm):
        body(comm, x.view(-1), out.view(-1), *args, launched)
    remember(comm, key, call, algorithm=algorithm, nbytes=nbytes, launched=launched,
             make_out=make_out, slow=lambda a, b: body(comm, a.view(-1), b.view(-1), *args),
             x=x, out=out, capture_choice=coll.capture_choice)
    return out
