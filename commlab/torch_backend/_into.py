"""commlab's collectives writing into the caller's tensor: no output allocated, no copy back.

torch's collectives name their output (``all_gather_into_tensor(out, inp)``, ...), so the
backend hands that tensor to the collective's kernels as their output whenever they may
write it directly: the output is contiguous and its memory is apart from the input's
(an input that is a slice of the output, as FSDP passes, takes the copying path),
on the CPU backend and on GPUs (``bench/checks/gpu_torch_backend_overhead.py`` checks
every op against gloo there). All-reduce and broadcast run in place: their kernels and host twins
read every input element before writing that element of the output (two-shot's and
one-shot's pushes precede their writes; ring stages the input; the host twins' reduction
takes a temporary when the output is a later operand). Each runner publishes a local
error through the agreement, as the public collectives do.
"""

from __future__ import annotations

import torch

from commlab.collectives._host import run
from commlab.collectives.all_gather import ALL_GATHER
from commlab.collectives.all_reduce import ALL_REDUCE
from commlab.collectives.all_to_all import ALL_TO_ALL
from commlab.collectives.broadcast import BROADCAST
from commlab.collectives.reduce_scatter import REDUCE_SCATTER
from commlab.runtime.communicator import publishes_local_errors


def writable(out: torch.Tensor, inp: torch.Tensor) -> bool:
    """Whether a kernel may write ``out`` directly while reading ``inp``."""
    if not out.is_contiguous():
        return False
    a, b = out.data_ptr(), inp.data_ptr()
    return a + out.nbytes <= b or b + inp.nbytes <= a


@publishes_local_errors("all_reduce", dispatch=True, out=0)
def all_reduce_(x: torch.Tensor, op: str, algorithm: str) -> torch.Tensor:
    """The reduction of every rank's ``x`` into ``x``."""
    return run(ALL_REDUCE, x, algorithm, op, out=x)


@publishes_local_errors("all_gather", dispatch=True, out=1)
def all_gather(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``x``: ``[1, k]``; ``out``: ``[W, k]``."""
    return run(ALL_GATHER, x, "auto", out=out)


@publishes_local_errors("reduce_scatter", dispatch=True, out=2)
def reduce_scatter(x: torch.Tensor, op: str, out: torch.Tensor) -> torch.Tensor:
    """``x``: ``[W, k]``; ``out``: ``[1, k]``."""
    return run(REDUCE_SCATTER, x, "auto", op, out=out)


@publishes_local_errors("all_to_all", dispatch=True, out=1)
def all_to_all(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``x`` and ``out``: ``[W, k]``."""
    return run(ALL_TO_ALL, x, "auto", out=out)


@publishes_local_errors("broadcast", dispatch=True, out=0)
def broadcast_(x: torch.Tensor, src: int) -> torch.Tensor:
    """``src``'s ``x`` into ``x`` on every rank."""
    return run(BROADCAST, x, "auto", src, out=x)
