"""``torch.ops.commlab.ag_gemm`` / ``gemm_rs`` (and ``all_gather`` / ``reduce_scatter``):
commlab's ops as torch.library custom ops, so ``torch.compile`` (fullgraph) and autograd
can call them. Registered by ``import commlab.torch_backend.ops`` (about 20 ms, so not
by ``import commlab``).

Each has a fake impl (shapes from the world size), and the two GEMMs are each other's
gradient: for ``out = all_gather(a) @ b``, ``grad_a = gemm_rs(grad, b.T)`` and
``grad_b = all_gather(a).T @ grad``; for ``out = reduce_scatter(a @ b)``,
``grad_a = ag_gemm(grad, b.T)`` and ``grad_b = a.T @ all_gather(grad)``. So a
tensor-parallel MLP (ag_gemm, then gemm_rs) trains with commlab's kernels both ways.
"""

from __future__ import annotations

import torch

from commlab.runtime import get_communicator


def _world() -> int:
    return get_communicator().world_size


@torch.library.custom_op("commlab::all_gather", mutates_args=())
def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0 (``commlab.all_gather``)."""
    from commlab.collectives import all_gather as _all_gather

    return _all_gather(x)


@all_gather.register_fake
def _(x):
    return x.new_empty((_world() * x.shape[0], *x.shape[1:]))


@torch.library.custom_op("commlab::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of chunk ``rank`` of ``x``'s dim 0 (``commlab.reduce_scatter``)."""
    from commlab.collectives import reduce_scatter as _reduce_scatter

    return _reduce_scatter(x.contiguous())


@reduce_scatter.register_fake
def _(x):
    return x.new_empty((x.shape[0] // _world(), *x.shape[1:]))


@torch.library.custom_op("commlab::ag_gemm", mutates_args=())
def ag_gemm(a: torch.Tensor, b: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
    """``all_gather(a) @ b`` (``commlab.ag_gemm``): a [M/W, K], b [K, N] -> [M, N]."""
    from commlab.overlap import ag_gemm as _ag_gemm

    return _ag_gemm(a.contiguous(), b.contiguous(), algorithm=algorithm)


@ag_gemm.register_fake
def _(a, b, algorithm="auto"):
    return a.new_empty((_world() * a.shape[0], b.shape[1]))


@torch.library.custom_op("commlab::gemm_rs", mutates_args=())
def gemm_rs(a: torch.Tensor, b: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
    """``reduce_scatter(a @ b)`` (``commlab.gemm_rs``): a [M, K/W], b [K/W, N] -> [M/W, N]."""
    from commlab.overlap import gemm_rs as _gemm_rs

    return _gemm_rs(a.contiguous(), b.contiguous(), algorithm=algorithm)


@gemm_rs.register_fake
def _(a, b, algorithm="auto"):
    return a.new_empty((a.shape[0] // _world(), b.shape[1]))


# --- autograd ---------------------------------------------------------------------------


def _setup(ctx, inputs, output):
    a, b, algorithm = inputs
    ctx.save_for_backward(a, b)
    ctx.algorithm = algorithm


def _ag_gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad = grad.contiguous()
    grad_a = gemm_rs(grad, b.t().contiguous(), ctx.algorithm)
    grad_b = all_gather(a).t() @ grad
    return grad_a, grad_b, None


def _gemm_rs_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad = grad.contiguous()
    grad_a = ag_gemm(grad, b.t().contiguous(), ctx.algorithm)
    grad_b = a.t() @ all_gather(grad)
    return grad_a, grad_b, None


def _all_gather_backward(ctx, grad):
    return reduce_scatter(grad)  # the sum of every rank's gradient of our chunk


def _reduce_scatter_backward(ctx, grad):
    return all_gather(grad)


ag_gemm.register_autograd(_ag_gemm_backward, setup_context=_setup)
gemm_rs.register_autograd(_gemm_rs_backward, setup_context=_setup)
all_gather.register_autograd(_all_gather_backward)
reduce_scatter.register_autograd(_reduce_scatter_backward)

__all__ = ["ag_gemm", "all_gather", "gemm_rs", "reduce_scatter"]
