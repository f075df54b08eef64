"""The Communicator's lazy build, for the first native call of a "commlab" group.

The build is collective over the whole world (its heap, a gloo group, the tuning table),
and a group's collective may be called by only some ranks (a bug, or torch's own
``test_barrier_timeout_full_group``). So before any step that would block, every rank
checks in through the default group's store and waits for the others under the calling
group's timeout: a rank that does not come raises ``CollectiveTimeoutError`` naming it,
after that timeout, on the ranks that came. Once all are in, every later step of the build
is among ranks that are all inside it.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from commlab.errors import CollectiveTimeoutError

_BUILDS = [0]  # builds begun by this process (the same count on every rank)


def build(op: str, timeout_s: float):
    """``commlab.init()`` once every rank of the world has arrived (``op``: the call)."""
    from commlab.runtime import init

    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    _BUILDS[0] += 1
    prefix = f"commlab-build/{_BUILDS[0]}/"
    store.set(f"{prefix}{rank}", op)
    try:
        store.wait([f"{prefix}{r}" for r in range(world)], timedelta(seconds=timeout_s))
    except (RuntimeError, TimeoutError) as e:  # DistStoreError is a RuntimeError
        missing = [r for r in range(world) if not store.check([f"{prefix}{r}"])]
        if not missing:  # they came just now
            return init()
        # withdraw, so the next attempt meets the late ranks under the same number
        _BUILDS[0] -= 1
        try:
            store.delete_key(f"{prefix}{rank}")
        except RuntimeError:  # a store without deletion: the late ranks go on alone
            pass
        who = ("rank " if len(missing) == 1 else "ranks ") + ", ".join(map(str, missing))
        raise CollectiveTimeoutError(
            f"dist.{op} on rank {rank}: commlab builds its Communicator at the first "
            f"collective on a group spanning the world, with every rank; {who} did not "
            f"arrive within the {timeout_s:g} s timeout (the group's). Call each collective "
            f"on every rank of its group, or build it up front with commlab.init() on "
            f"every rank") from e
    return init()
