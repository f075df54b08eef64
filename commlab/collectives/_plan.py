"""Launch plans: what a repeated collective call needs, computed once.

The first call with a given (op, shape, dtype, parameters) validates everything, encodes
the agreement signature and compiles the kernel; later identical calls only publish the
cached signature, allocate the output and launch the compiled kernel directly. That is
what brings an eager small all-reduce down to the cost of a few Python calls. Plans
live on the Communicator and die with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from commlab.runtime._control import Signature


@dataclass
class Plan:
    sig: Signature
    raw: bytes
    algorithm: str
    nbytes: int
    # CUDA only: (compiled kernel, grid, arguments after (x, out)) once the first launch
    # compiled it; None means "launch through the ordinary path"
    compiled: object = None
    grid: tuple = (1, 1, 1)
    tail: tuple = ()
    extra: dict = field(default_factory=dict)


def aligned(*ts: torch.Tensor) -> bool:
    """16-byte aligned data pointers: the specialisation the cached kernel was built for."""
    return all(t.data_ptr() % 16 == 0 for t in ts)
