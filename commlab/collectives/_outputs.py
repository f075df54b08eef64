"""Output buffers a launch plan owns and hands out again once nobody holds them.

``torch.empty_like`` is about 6% of an eager all-reduce on the H200 host. A plan keeps a
few outputs it made; a call takes one back only when nothing but the plan refers to it:

- no Python reference (``sys.getrefcount``), no C++ reference to the tensor (autograd's
  saved tensors, ``t._use_count()``) and none to its storage (views, ``untyped_storage``);
- the same current stream as its last launch (the stream orders our write after every
  earlier use of the buffer on it) and its address unchanged (``resize_``/``set_``);
- never while a CUDA graph is being captured (a captured address must stay the graph's).

So a result the caller still holds, or any view of it, is never overwritten. The one case
this cannot see is a result dropped after ``record_stream`` on another stream: keep such a
result referenced until that stream is done (with the caching allocator alone, freeing it
would have been safe). ``REUSE[0] = False`` turns reuse off.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

REUSE = [hasattr(torch.Tensor, "_use_count") and hasattr(torch._C, "_storage_Use_Count")]
SLOTS = 4  # outputs kept per plan: a caller holding up to 3 results still reuses the 4th
# C++ reference counts (without them, REUSE is off): a storage's, a tensor's
_use_storage: Callable[[int], int] = getattr(torch._C, "_storage_Use_Count", None) or int
_use_tensor: Callable[[torch.Tensor], int] = getattr(torch.Tensor, "_use_count", None) or id
_refs = sys.getrefcount


def _free_refs() -> int:
    """``getrefcount(tensors[i])`` of an output only the list holds (2 on CPython <= 3.13:
    the list's reference and the argument's), measured the way ``take`` reads it."""
    tensors = [torch.empty(0)]
    for i in range(1):
        return _refs(tensors[i])
    return 0


def _free_storage_refs() -> int:
    """The same for an output's storage object while the list holds it and its tensor
    (the tensor's storage keeps one more reference to that Python object)."""
    tensors = [torch.empty(1)]
    storages = [tensors[0].untyped_storage()]
    for i in range(1):
        return _refs(storages[i])
    return 0


FREE = _free_refs()
FREE_STORAGE = _free_storage_refs()


class Outputs:
    """The outputs of one plan: ``take(x, stream)`` returns one free to overwrite."""

    __slots__ = ("make", "tensors", "storages", "slots")

    def __init__(self, make: Callable[[torch.Tensor], torch.Tensor]):
        self.make = make
        self.tensors: list[torch.Tensor] = []  # only these lists refer to them
        # each output's storage, held here: its use count is 2 while only we hold it (its
        # Python object is the one ``untyped_storage()`` returns to anyone: count that too)
        self.storages: list = []
        self.slots: list[tuple] = []  # per output: (storage cdata, address, stream)

    def take(self, x: torch.Tensor, stream: int, capturing: bool = False) -> torch.Tensor:
        """An output for ``x``: one of ours that nobody else holds, else a new one (kept
        while fewer than ``SLOTS``). ``stream``: the launch's stream handle (0 on CPU)."""
        if capturing or not REUSE[0]:
            return self.make(x)
        tensors = self.tensors
        for i in range(len(tensors)):
            if _refs(tensors[i]) == FREE and _refs(self.storages[i]) == FREE_STORAGE:
                cdata, ptr, s = self.slots[i]
                t = tensors[i]
                if (s == stream and _use_storage(cdata) == 2 and _use_tensor(t) == 1
                        and t.data_ptr() == ptr and not t.requires_grad):
                    return t
        out = self.make(x)
        if len(tensors) < SLOTS:
            storage = out.untyped_storage()
            tensors.append(out)
            self.storages.append(storage)
            self.slots.append((storage._cdata, out.data_ptr(), stream))
        return out

    def clear(self) -> None:
        self.tensors.clear()
        self.storages.clear()
        self.slots.clear()
