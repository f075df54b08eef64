"""The host side shared by the data-movement ops (all_gather, all_to_all, broadcast),
which each have two algorithms, ``direct`` (SM pushes, in the op's own file) and
``copy_engine`` (``_copy_engine``): the cached fast path, the argument rules and the
agreement, the choice of algorithm (``_select.choose_move``), tracing and launch plans.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from commlab.collectives._common import agree, check_local, comm_or_raise, traced
from commlab.collectives._plan import fast_call, remember
from commlab.collectives._select import capturing_auto, choose_move


def run_move(op: str, x, algorithm: str, bodies: dict[str, Callable], *,
             make_out: Callable = torch.empty_like, rules: dict | None = None,
             extra_rule: Callable | None = None, fields: dict | None = None) -> torch.Tensor:
    """Run ``op`` on ``x``: ``bodies[algo](comm, x, out, *fields.values(), record)`` moves
    the data; ``rules`` go to check_local, ``extra_rule(x)`` returns one more error text
    (or ""), ``fields`` (e.g. ``src``) are agreed on and passed to the body."""
    comm = comm_or_raise()
    fields = fields or {}
    args = tuple(fields.values())
    key = None
    if isinstance(x, torch.Tensor):
        key = (op, x.shape, x.dtype, x.device, *args, algorithm)
        out = None if capturing_auto(comm, algorithm) else fast_call(comm, key, x)
        if out is not None:
            return out
    err = check_local(op, comm, x, algorithm=algorithm, **(rules or {}))
    if not err and extra_rule is not None:
        err = extra_rule(x)
    call = agree(op, x, err, **fields, algorithm=algorithm)
    x = call.x.contiguous()
    out = make_out(x)
    nbytes = out.numel() * out.element_size()
    algo = choose_move(comm, op, x.dtype, nbytes) if algorithm == "auto" else algorithm
    if x.numel() == 0:
        return out
    body = bodies[algo]
    launched: list = []
    with traced(op, nbytes, algo, comm.device):
        body(comm, x, out, *args, launched)
    remember(comm, key, call, algorithm=algo, nbytes=nbytes, launched=launched,
             make_out=make_out, slow=lambda a, b: body(comm, a, b, *args))
    return out
