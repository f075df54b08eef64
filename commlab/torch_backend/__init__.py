"""The "commlab" torch.distributed backend: DDP, FSDP2, DTensor and torch.compile on
commlab's kernels.

    import commlab                                   # registers "commlab" (nothing built)
    dist.init_process_group("commlab")               # CPU; on GPUs "cpu:gloo,cuda:commlab"
    comm = commlab.init()                            # the Communicator the backend built

What runs on commlab's kernels and what goes to the fallback group: README.md here.
"""

from __future__ import annotations

import torch.distributed as dist

NAME = "commlab"


def _create(opts, pg_options=None):
    from commlab.torch_backend._group import CommlabProcessGroup

    ranks = list(opts.global_ranks_in_group)
    is_default = not dist.is_initialized()
    world = opts.group_size if is_default else dist.get_world_size()
    spans_world = not ranks or sorted(ranks) == list(range(world))
    return CommlabProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                               spans_world=spans_world, is_default=is_default)


def register() -> None:
    """Register the "commlab" backend with torch.distributed (idempotent, cheap)."""
    if NAME.upper() in dist.Backend._plugins:
        return
    from commlab.runtime import set_group_source
    from commlab.runtime._shrink import set_torch_regroup
    from commlab.torch_backend import _regroup
    from commlab.torch_backend._world import group_source

    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    set_group_source(group_source)
    set_torch_regroup(_regroup.owns_default, _regroup.regroup)


def __getattr__(name):
    if name == "CommlabProcessGroup":
        from commlab.torch_backend._group import CommlabProcessGroup

        return CommlabProcessGroup
    raise AttributeError(f"module 'commlab.torch_backend' has no attribute {name!r}")


__all__ = ["NAME", "CommlabProcessGroup", "register"]
