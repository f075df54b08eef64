"""The IPC heap: a symmetric heap for ranks that share a GPU (or ask: ``COMMLAB_HEAP=ipc``).

torch's symmetric memory refuses two ranks on one device, so each rank allocates its own
heap (``cuMemAlloc``), exports a CUDA IPC handle, and opens every peer's handle, which
maps the peer's heap into this process at some address: that address is the peer's base
in ``comm.context``, and ``cl.symm_at`` moves pointers by base differences as it does over
symmetric memory. Bookkeeping, in order, and what each step makes safe:

1. allocate and export this rank's heap;
2. publish an *offer* (rank, pid, GPU, layout, handle) and receive every rank's;
3. check every offer against ours: a different layout (heap or scratch size) is refused
   on every rank alike, after each frees its own heap, so the world is never half-built;
4. open the peers' handles in rank order, then publish whether that worked: one rank's
   failed open is raised on every rank, each having closed what it opened;
5. close: close every import, then set this rank's *closed word*; free our own heap only
   once every peer's closed word is set or its process is gone (freeing memory a peer
   still maps is undefined behaviour in CUDA). A peer that does neither within
   ``COMMLAB_IPC_CLOSE_WAIT`` seconds leaves our heap to this process's exit, when the
   driver frees everything the process held, however it ends.

The driver (``_cuda_ipc.Driver``) and the exchange are parameters, so the bookkeeping is
tested on the CPU with any object that can allocate, export, open, close and free.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass
from typing import Protocol

from commlab.errors import CommlabUsageError
from commlab.runtime.membership import alive as _alive

OPEN, CLOSED = 0, 1  # a rank's closed word: still mapping its peers' heaps, or not any more


class Driver(Protocol):
    def alloc(self, nbytes: int) -> int: ...
    def export(self, ptr: int) -> bytes: ...
    def open(self, handle: bytes) -> int: ...
    def close(self, ptr: int) -> None: ...
    def free(self, ptr: int) -> None: ...


@dataclass(frozen=True)
class Offer:
    """What a rank publishes: who it is, where its heap lives, and the handle to it."""

    rank: int
    pid: int
    gpu: str
    layout: tuple[int, int]  # (heap size, scratch bytes)
    handle: bytes


def _fmt(layout: tuple[int, int]) -> str:
    size, scratch = layout
    return f"heap {size} B, scratch {scratch} B"


class IpcHeap:
    """This rank's mapping of every rank's heap: ``bases[r]`` is rank r's heap as mapped
    here (our own allocation for ourselves). ``close()`` undoes it in the safe order."""

    def __init__(self, driver: Driver, rank: int, world_size: int,
                 layout: tuple[int, int], gpu: str, exchange: Callable[[object], list],
                 words: MutableSequence[int], *, close_wait: float = 10.0,
                 alive: Callable[[int], bool] = _alive):
        self.driver, self.rank, self.world_size = driver, rank, world_size
        self.words = words  # 2 per rank, shared by the ranks of the host: pid, closed word
        self.close_wait, self._alive = close_wait, alive
        self.closed = False
        self.events: list[tuple[str, int]] = []  # ("alloc"|"open"|"close"|"free", rank)
        self.own = driver.alloc(layout[0])
        self.events.append(("alloc", rank))
        try:
            mine = Offer(rank, os.getpid(), gpu, layout, driver.export(self.own))
            offers = exchange(mine)
            self._check(offers, mine)
        except BaseException:
            self._free_own()
            raise
        self.pids = [o.pid for o in offers]
        words[2 * rank], words[2 * rank + 1] = os.getpid(), OPEN
        self.bases = [0] * world_size
        self.bases[rank] = self.own
        error = ""
        for o in offers:
            if o.rank == rank:
                continue
            try:
                self.bases[o.rank] = driver.open(o.handle)
                self.events.append(("open", o.rank))
            except Exception as e:  # told to every rank below
                error = f"rank {rank} could not open rank {o.rank}'s heap: {e}"
                break
        errors = [e for e in exchange(error) if e]
        if errors:
            self._close_imports()
            self._free_own()
            raise CommlabUsageError(
                f"commlab.init: the IPC heap could not be mapped ({'; '.join(errors)}); "
                f"every rank must see the others' GPU (same machine, CUDA IPC allowed: not "
                f"across containers with separate IPC namespaces)")

    def _check(self, offers: list, mine: Offer) -> None:
        if [o.rank for o in offers] != list(range(self.world_size)):
            raise CommlabUsageError(
                f"commlab.init: the IPC heap's offers came back as ranks "
                f"{[o.rank for o in offers]}, expected 0..{self.world_size - 1}")
        odd = [o for o in offers if o.layout != mine.layout]
        if odd:
            sides: dict[str, list[int]] = {}
            for o in offers:
                sides.setdefault(_fmt(o.layout), []).append(o.rank)
            listed = "; ".join(f"ranks {rs}: {k}" for k, rs in sides.items())
            raise CommlabUsageError(
                f"commlab.init: the heap layout differs across ranks ({listed}); pass the "
                f"same heap_size and scratch_size (or COMMLAB_HEAP_SIZE/COMMLAB_SCRATCH_SIZE) "
                f"on every rank")
        handles = [o.handle for o in offers]
        if len(set(handles)) != len(handles):
            raise CommlabUsageError(
                "commlab.init: two ranks published the same IPC handle; each rank must "
                "allocate its own heap (is one process joining the world twice?)")

    def _close_imports(self) -> None:
        for r in reversed(range(self.world_size)):
            if r != self.rank and self.bases[r]:
                try:
                    self.driver.close(self.bases[r])
                    self.events.append(("close", r))
                except Exception as e:  # a broken context: the process exit unmaps it
                    print(f"commlab: closing rank {r}'s heap failed: {e}", file=sys.stderr)
                self.bases[r] = 0

    def _free_own(self) -> None:
        if self.own:
            self.driver.free(self.own)
            self.events.append(("free", self.rank))
            self.own = 0

    def peers_unmapped(self) -> list[int]:
        """The peers that still map our heap: closed word unset and process alive."""
        return [r for r in range(self.world_size) if r != self.rank
                and self.words[2 * r + 1] != CLOSED and self._alive(self.pids[r])]

    def close(self) -> None:
        """Close every import, say so, then free our heap once no peer maps it."""
        if self.closed:
            return
        self.closed = True
        self._close_imports()
        self.words[2 * self.rank + 1] = CLOSED
        deadline = time.monotonic() + self.close_wait
        while (waiting := self.peers_unmapped()) and time.monotonic() < deadline:
            time.sleep(0.002)
        if waiting:
            print(f"commlab: rank {self.rank}'s IPC heap stays allocated until this process "
                  f"exits: rank{'s' * (len(waiting) > 1)} {waiting} still map it",
                  file=sys.stderr)
            self.own = 0
            return
        self._free_own()
