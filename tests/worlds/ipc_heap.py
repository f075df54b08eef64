"""Rank functions for tests/test_ipc_heap.py: the IPC heap's bookkeeping on CPU ranks.

``ShmDriver`` does what the CUDA driver does for the IPC heap with POSIX shared memory:
``alloc`` makes a segment, ``export`` names it (padded to the 64 bytes of a CUDA IPC
handle), ``open`` maps a peer's segment at an address of this process, ``close`` unmaps
it, ``free`` drops our own. The memory is real, so a peer's value read through ``bases``
proves the exchange right; ``fail_open`` makes one rank's open fail.
"""

from __future__ import annotations

import ctypes
import mmap
import time

import numpy as np

from commlab.runtime import _heaps, _shm
from commlab.runtime._ipc_heap import IpcHeap


class ShmDriver:
    def __init__(self, token: str, rank: int, fail_open: bool = False):
        self.token, self.rank, self.fail_open = token, rank, fail_open
        self.maps: dict[int, tuple[mmap.mmap, str]] = {}  # address -> (mapping, name)
        self.open_now: set[int] = set()

    def _addr(self, m: mmap.mmap) -> int:
        return ctypes.addressof(ctypes.c_char.from_buffer(m))

    def alloc(self, nbytes: int) -> int:
        name = _shm.segment_name(self.token, "ipct", self.rank)
        m = _shm.create(name, nbytes)
        addr = self._addr(m)
        self.maps[addr] = (m, name)
        return addr

    def export(self, ptr: int) -> bytes:
        return self.maps[ptr][1].encode().ljust(64, b"\0")

    def open(self, handle: bytes) -> int:
        if self.fail_open:
            raise RuntimeError("CUDA_ERROR_INVALID_HANDLE (planted)")
        name = handle.rstrip(b"\0").decode()
        m = _shm.open_existing(name, 1 << 16)
        addr = self._addr(m)
        self.maps[addr] = (m, name)
        self.open_now.add(addr)
        return addr

    def close(self, ptr: int) -> None:
        self.open_now.discard(ptr)
        m, _ = self.maps.pop(ptr)
        m.close()

    def free(self, ptr: int) -> None:
        m, name = self.maps.pop(ptr)
        _shm.unlink(name)
        m.close()


def _heap(comm, layout=(1 << 16, 1 << 12), fail_open=False):
    world = comm._world
    keep: list = []
    words_buf = _heaps.shared_block(world, "ipcw", 16 * world.world_size, keep)
    words = np.frombuffer(words_buf, dtype=np.int64)
    driver = ShmDriver(world.token, comm.rank, fail_open)
    heap = IpcHeap(driver, comm.rank, comm.world_size, layout, "gpu-0",
                   lambda obj: _heaps.exchange(world, obj), words, close_wait=20.0)
    return heap, driver, keep


def maps_and_frees_world(comm, slow_rank: int) -> dict:
    """Every rank stamps its heap, reads every peer's stamp through ``bases``, closes;
    ``slow_rank`` closes 1 s late. Returns the events and when imports closed / own freed."""
    heap, driver, keep = _heap(comm)
    ctypes.c_int64.from_address(heap.bases[comm.rank]).value = 1000 + comm.rank
    import torch.distributed as dist

    dist.barrier(group=comm.cpu_group)  # every stamp written
    seen = [ctypes.c_int64.from_address(heap.bases[r]).value for r in range(comm.world_size)]
    distinct = len(set(heap.bases)) == comm.world_size
    dist.barrier(group=comm.cpu_group)  # every read done before anyone closes
    if comm.rank == slow_rank:
        time.sleep(1.0)
    t_close = time.monotonic()
    heap.close()
    t_free = time.monotonic()
    return {"seen": seen, "distinct": distinct, "events": heap.events, "t_close": t_close,
            "t_free": t_free, "left_open": len(driver.open_now), "own": heap.own,
            "token": comm._world.token}


def layout_world(comm) -> dict:
    """Rank 1 asks for another heap size: every rank must refuse alike, freeing its own."""
    layout = (1 << 17, 1 << 12) if comm.rank == 1 else (1 << 16, 1 << 12)
    return _refused(comm, layout=layout)


def failed_open_world(comm) -> dict:
    """Rank 2 cannot open rank 0's handle: every rank raises, having undone its opens."""
    return _refused(comm, fail_open=comm.rank == 2)


def _refused(comm, **kwargs) -> dict:
    world = comm._world
    keep: list = []
    words_buf = _heaps.shared_block(world, "ipcw", 16 * world.world_size, keep)
    layout = kwargs.get("layout", (1 << 16, 1 << 12))
    driver = ShmDriver(world.token, comm.rank, kwargs.get("fail_open", False))
    heap = None
    try:
        heap = IpcHeap(driver, comm.rank, comm.world_size, layout, "gpu-0",
                       lambda obj: _heaps.exchange(world, obj),
                       np.frombuffer(words_buf, dtype=np.int64))
        error = ""
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "built": heap is not None, "maps_left": len(driver.maps),
            "open_left": len(driver.open_now)}
