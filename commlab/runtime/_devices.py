"""Which GPU each rank uses, which ranks share one, and so which heap the world gets.

A rank's GPU is ``COMMLAB_DEVICE`` when set (``%dist_start --devices`` sets it), else
``LOCAL_RANK % device_count``: four ranks on a one-GPU machine all land on GPU 0. Ranks
publish their GPU's UUID at bootstrap, so sharing is seen across ``CUDA_VISIBLE_DEVICES``
masks. When two ranks share a GPU, NCCL refuses them ("Duplicate GPU") and torch's
symmetric memory refuses the heap, so such a world bootstraps on gloo alone and gets the
CUDA IPC heap (``runtime/_ipc_heap.py``); ``COMMLAB_HEAP`` may ask for either heap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from commlab import _config
from commlab.errors import CommlabUsageError

HEAPS = ("auto", "symmetric", "ipc")


def device_index(local_rank: int) -> int | None:
    """This rank's GPU index, or None without a GPU."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return None
    explicit = _config.get("COMMLAB_DEVICE")
    if explicit is None:
        return local_rank % n
    if not 0 <= explicit < n:
        raise CommlabUsageError(
            f"COMMLAB_DEVICE={explicit}: this machine has {n} GPU{'s' * (n != 1)} "
            f"(indices 0..{n - 1}); name one of them (%dist_start --devices 0,0,... "
            f"puts several ranks on one)")
    return explicit


def identity(index: int) -> str:
    """A string naming the physical GPU: its UUID (the same for every process that sees
    it, whatever its CUDA_VISIBLE_DEVICES)."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid else f"{props.name}#{index}"


@dataclass(frozen=True)
class Placement:
    """Where a world's ranks run: ``gpus[r]`` is rank r's GPU identity ("" for none)."""

    gpus: tuple[str, ...]

    def sharing(self, rank: int) -> list[int]:
        """The ranks on ``rank``'s GPU (itself included), in rank order."""
        mine = self.gpus[rank]
        return [r for r, g in enumerate(self.gpus) if mine and g == mine]

    @property
    def shared(self) -> bool:
        """Whether any two ranks share a GPU."""
        used = [g for g in self.gpus if g]
        return len(used) != len(set(used))

    def heap(self, wanted: str | None = None) -> str:
        """The cuda heap the world gets: "ipc" or "symmetric" (same on every rank)."""
        wanted = (wanted or _config.get("COMMLAB_HEAP") or "auto").lower()
        if wanted not in HEAPS:
            raise CommlabUsageError(
                f"COMMLAB_HEAP={wanted!r}: must be one of {', '.join(HEAPS)}")
        if wanted == "symmetric" and self.shared:
            groups = self.groups()
            raise CommlabUsageError(
                f"COMMLAB_HEAP=symmetric: ranks {groups[0]} share one GPU, and torch's "
                f"symmetric memory refuses allocations from overlapping devices; unset "
                f"COMMLAB_HEAP (the IPC heap is chosen for shared GPUs) or give each rank "
                f"its own GPU")
        if wanted == "auto":
            return "ipc" if self.shared else "symmetric"
        return wanted

    def groups(self) -> list[list[int]]:
        """Ranks grouped by GPU, only the groups of two or more."""
        seen: dict[str, list[int]] = {}
        for r, g in enumerate(self.gpus):
            if g:
                seen.setdefault(g, []).append(r)
        return [rs for rs in seen.values() if len(rs) > 1]

    def describe(self) -> str:
        """One line for people: who shares which GPU and what that means for timings."""
        groups = self.groups()
        if not groups:
            return ""
        per = max(len(g) for g in groups)
        where = "one GPU" if len(groups) == 1 else f"{len(groups)} GPUs"
        return (f"{len(self.gpus)} ranks share {where} ({per} per GPU): the ranks' kernels "
                f"time-slice the GPU, so timings are not representative of one GPU per rank")
