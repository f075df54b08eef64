"""The runtime: bootstrap, the Communicator, the symmetric heap."""

from commlab._interpreter import triton_lib as _triton_lib
from commlab.runtime._bootstrap import set_group_source
from commlab.runtime._control import SYNC_HOOK, Signature
from commlab.runtime._grow import grow
from commlab.runtime._hosts import HostGroups
from commlab.runtime._join import join as _join  # noqa: F401 (init(join=True))
from commlab.runtime._shrink import shrink
from commlab.runtime.communicator import (
    Communicator,
    current_communicator,
    finalize,
    get_communicator,
    init,
    parse_size,
    symmetric_empty,
    symmetric_zeros,
)

__all__ = ["SYNC_HOOK", "Communicator", "HostGroups", "Signature", "current_communicator",
           "finalize", "get_communicator", "grow", "init", "parse_size", "set_group_source",
           "shrink", "symmetric_empty", "symmetric_zeros", "synchronize"]


def synchronize() -> None:
    """Check every collective this rank ran ahead of the agreement, then wait for its
    device. A repeated call of a cached plan launches without waiting for the other
    ranks and is checked at this rank's next call that waits, ``barrier()``, an
    allocation, or here: a mismatch it had raises here at the latest (the same
    RankMismatchError every rank raises). A ``%%distributed`` cell calls it at its end."""
    get_communicator().synchronize()

_triton_lib.adopt()  # `import triton` may have come before `import commlab`: fix its helpers
