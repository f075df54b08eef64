"""The runtime: bootstrap, the Communicator, the symmetric heap."""

from commlab.runtime.communicator import (
    Communicator,
    finalize,
    get_communicator,
    init,
    symmetric_empty,
    symmetric_zeros,
)

__all__ = ["Communicator", "finalize", "get_communicator", "init", "symmetric_empty",
           "symmetric_zeros"]
