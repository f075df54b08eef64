"""Wait records: what each program of a GPU kernel waits for, readable from the host
while the kernel spins (the hang report's wait-for graph on GPUs).

One pinned host buffer per communicator, ``SLOTS`` slots of int64 ``[flag address,
value]``, one per program id. Pinned memory is mapped into the GPU's address space under
unified addressing, so a kernel stores to it with plain (write-through) stores and the
host reads it as ordinary memory, with no CUDA call, even while the kernel spins.
``cl.wait(ptr, value, ctx)`` writes the value, then the address, once its first look at
the flag fails, and clears the address when the wait is satisfied; ``read`` (``now(comm)``)
takes a slot whose address reads the same before and after its value (not torn). Its address
sits at the end of the context (``commlab.language``'s ``ctx`` layout); 0 on the CPU
backend, whose waits the interpreter sees directly.

After the slots, one more int64: the *abort word*. The host sets it when it finds a rank
lost (``abort``); every spin of ``cl.wait(..., ctx)`` and ``cl.barrier`` loads it once
every ``CHECK_EVERY`` spins (never on a wait satisfied at once) and returns when it is
set, so no kernel spins forever on a dead peer. ``commlab.shrink()`` clears it once this
rank's kernels have ended.
"""

from __future__ import annotations

import numpy as np
import torch

SLOTS = 1024  # programs with a record; a higher program id waits unrecorded
ABORT = 2 * SLOTS  # the abort word's index (int64) in the buffer
CHECK_EVERY = 1024  # spins between two loads of the abort word (a power of two)


def allocate(device: torch.device) -> tuple[torch.Tensor | None, int]:
    """The records buffer for a communicator on ``device`` and the address kernels get
    (None, 0 on CPU)."""
    if device.type != "cuda":
        return None, 0
    with torch.cuda.device(device):  # the rank's own context, not device 0's
        buf = torch.zeros(2 * SLOTS + 1, dtype=torch.int64, pin_memory=True)
    return buf, buf.data_ptr()


def abort(buf: torch.Tensor | None) -> None:
    """Make this rank's spinning kernels return (host memory: safe while they run)."""
    if buf is not None:
        buf.numpy()[ABORT] = 1


def clear_abort(buf: torch.Tensor | None) -> None:
    """Let spins wait again (only once this rank's kernels have ended)."""
    if buf is not None:
        buf.numpy()[ABORT] = 0


def aborted(buf: torch.Tensor | None) -> bool:
    return buf is not None and bool(buf.numpy()[ABORT])


def now(comm) -> list[dict]:
    """What the programs of this rank's GPU kernels wait for now (``read`` of the
    communicator's records; [] on CPU)."""
    return read(comm.local.wait_records)


def read(buf: torch.Tensor | None) -> list[dict]:
    """The programs waiting now: ``{"program", "addr", "wants", "op", "kind"}`` each
    (no ``holds``: the flag is in device memory, which the host does not read)."""
    if buf is None:
        return []
    a = buf.numpy()[:ABORT]  # host memory: no CUDA call, safe while a kernel runs
    out = []
    for pid in np.flatnonzero(a[0::2]).tolist():
        addr = int(a[2 * pid])
        value = int(a[2 * pid + 1])
        if addr == 0 or int(a[2 * pid]) != addr:  # cleared, or rewritten meanwhile
            continue
        out.append({"program": pid, "addr": addr, "wants": value, "op": ">=",
                    "kind": "wait", "where": "a GPU kernel (no line on GPUs)"})
    return out
