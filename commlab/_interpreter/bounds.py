"""Host-side checks of ``cl.symm_at`` under the interpreter: a peer outside the world or
a pointer outside this rank's heap raises (with the kernel line) instead of SIGSEGV."""

from __future__ import annotations

import ctypes

import numpy as np
import triton

from commlab._interpreter.choose import interpreting
from commlab.errors import CommlabUsageError

_heap_size = [0]  # this rank's heap size in bytes; 0 while no communicator registered it


def set_heap_size(nbytes: int) -> None:
    _heap_size[0] = int(nbytes)


def heap_size() -> int:
    """This rank's heap size in bytes (0: no communicator registered it)."""
    return _heap_size[0]


if interpreting():

    def host_check_symm(ptr, peer, ctx):
        """Raise if ``peer`` is not a rank of the world or ``ptr`` is not in our heap."""
        c = int(np.asarray(ctx.handle.data).flat[0])
        me, world = (ctypes.c_int64.from_address(c + 8 * i).value for i in (0, 1))
        peers = np.asarray(getattr(getattr(peer, "handle", None), "data", peer)).ravel()
        bad = [int(p) for p in peers if not 0 <= int(p) < world]
        if bad:
            raise CommlabUsageError(
                f"cl.symm_at on rank {me}: peer {bad[0]} is outside the world (ranks "
                f"0..{world - 1}); pass a rank in range, e.g. (rank + k) % num_ranks")
        size = _heap_size[0]
        if size:
            base = ctypes.c_int64.from_address(c + 8 * (4 + me)).value
            addrs = np.asarray(ptr.handle.data).ravel().astype(np.int64)
            out = addrs[(addrs < base) | (addrs >= base + size)]
            if out.size:
                raise CommlabUsageError(
                    f"cl.symm_at on rank {me}: pointer {int(out[0]):#x} is outside the "
                    f"symmetric heap [{base:#x}, {base + size:#x}); pass a tensor from "
                    f"commlab.symmetric_empty/zeros (an ordinary tensor has no peer copy)")

else:

    @triton.jit
    def host_check_symm(ptr, peer, ctx):  # compiled: never reached (INTERPRET is False)
        pass
