"""The Communicator of a world whose default group is "commlab": which groups it uses.

``commlab.init()`` asks here (``commlab.runtime.set_group_source``) when torch.distributed
is already initialised. The heap's exchanges and the runtime's host-side barriers need a
registered gloo group (CUDA: gloo + NCCL, which PyTorch's symmetric memory rendezvous
uses), made here once, collectively, when the Communicator is built.
"""

from __future__ import annotations

import torch.distributed as dist

from commlab.errors import CommlabUsageError


def group_source(backend: str):
    """``(backend, group, cpu_group)`` for a "commlab" default group, else None."""
    from commlab import _interpreter as _interpret
    from commlab.torch_backend._group import CommlabProcessGroup

    if not isinstance(dist.group.WORLD, CommlabProcessGroup):
        return None
    chosen = "cpu" if _interpret.interpreting() else "cuda"
    if backend not in ("auto", chosen):
        raise CommlabUsageError(
            f"commlab.init(backend={backend!r}): the torch.distributed 'commlab' backend "
            f"runs on {chosen!r} in this process (Triton's interpreter is "
            f"{'on' if chosen == 'cpu' else 'off'}); call commlab.init() or "
            f"commlab.init(backend={chosen!r})"
        )
    group = dist.new_group(backend="gloo" if chosen == "cpu" else "cpu:gloo,cuda:nccl")
    return chosen, group, group
