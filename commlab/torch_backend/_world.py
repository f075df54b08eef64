"""The Communicator of a world whose default group is "commlab": which groups it uses.

``commlab.init()`` asks here (``commlab.runtime.set_group_source``) when torch.distributed
is already initialised. The heap's exchanges and the runtime's host-side barriers need a
registered gloo group (CUDA: gloo + NCCL, which PyTorch's symmetric memory rendezvous
uses; gloo alone where ranks share a GPU, which NCCL refuses), made here once,
collectively, when the Communicator is built.
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
    cpu = dist.new_group(backend="gloo")
    if chosen == "cpu":
        return chosen, cpu, cpu
    # NCCL refuses ranks that share a GPU, and the IPC heap needs no NCCL: gloo only then
    if ranks_share_gpus(cpu):
        return chosen, cpu, cpu
    group = dist.new_group(backend="cpu:gloo,cuda:nccl")
    return chosen, group, group


def ranks_share_gpus(group) -> bool:
    """Whether two ranks of ``group`` run on one GPU (collective over ``group``)."""
    import os

    from commlab.runtime._bootstrap import gather_placement

    local = os.environ.get("LOCAL_RANK") or str(dist.get_rank())
    return gather_placement(int(local), group).shared
