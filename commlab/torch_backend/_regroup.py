"""After ``commlab.shrink()``: torch.distributed's "commlab" default group again, over
the survivors.

A ProcessGroup's rank and size are fixed in C++ when it is made, and DDP divides every
gradient by that size, so no group can change its size in place: the survivors get a new
default group (``dist.group.WORLD``, ``dist.get_world_size()`` the new size) and every
"commlab" group made before is retired: its calls raise CommlabUsageError saying which
group to use and that a model must be wrapped in DistributedDataParallel again (a
backward that failed midway leaves DDP's reducer mid-iteration anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def owns_default() -> bool:
    """Whether torch.distributed's default group is a "commlab" group."""
    from commlab.torch_backend._group import CommlabProcessGroup

    return isinstance(dist.group.WORLD, CommlabProcessGroup)


def regroup(size: int) -> Callable[[Any], tuple]:
    """Retire every "commlab" group now (they must not close the Communicator when
    ``shrink`` destroys them); return the connect step ``shrink`` runs in its watched
    thread: it builds, through ``attempt`` (a ``commlab.runtime._watched_groups.Attempt``,
    which ``shrink`` registers once every survivor connected), the new default group, then
    the Communicator's gloo group, both blocking until every survivor connected."""
    from commlab.torch_backend._group import CommlabProcessGroup

    groups = [pg for pg in dist.distributed_c10d._world.pg_map
              if isinstance(pg, CommlabProcessGroup)]
    for pg in groups:
        pg.retire(
            f"this process group ({pg.size()} ranks) was retired by commlab.shrink(): the "
            f"survivors' group is torch.distributed's default group now ({size} ranks, "
            f"dist.group.WORLD); pass group=None, make subgroups again with dist.new_group, "
            f"and wrap a model in DistributedDataParallel again (DDP divides gradients by "
            f"the size its group had when it was made)")

    def connect(attempt) -> tuple:
        attempt.default("commlab")  # dist.init_process_group("commlab")
        cpu = attempt.new_group(backend="gloo")  # dist.new_group(backend="gloo")
        return cpu, cpu

    return connect
