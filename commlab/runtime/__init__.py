"""The runtime: bootstrap, the Communicator, the symmetric heap."""

from commlab._interpreter import triton_lib as _triton_lib
from commlab.runtime._bootstrap import set_group_source
from commlab.runtime._control import SYNC_HOOK, Signature
from commlab.runtime._hosts import HostGroups
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
           "finalize", "get_communicator", "init", "parse_size", "set_group_source",
           "shrink", "symmetric_empty", "symmetric_zeros"]

_triton_lib.adopt()  # `import triton` may have come before `import commlab`: fix its helpers
