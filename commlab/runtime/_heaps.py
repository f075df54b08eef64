"""Building a host's heap and agreement block: shared memory (cpu), torch's symmetric
memory (cuda, one GPU per rank) or the CUDA IPC heap (cuda, ranks sharing a GPU).

Each builder returns ``(heap, control)``; everything that must outlive the call (the
mappings, torch's handle, the IPC heap) goes into ``keep``, which the Communicator holds.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commlab import _config
from commlab.errors import CommlabUsageError
from commlab.runtime import _shm
from commlab.runtime._bootstrap import World
from commlab.runtime._control import ControlBlock
from commlab.runtime.heap import HeapLayout, SymmetricHeap, _fmt_bytes


def exchange(world: World, obj) -> list:
    """Every rank's ``obj``, in rank order (an all-gather over the world's gloo group)."""
    out = [None] * world.world_size
    dist.all_gather_object(out, obj, group=world.cpu_group)
    return out


def _addr(m) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def shared_block(world: World, kind: str, nbytes: int, keep: list):
    """A zeroed shared-memory block every rank of the host maps (rank 0 creates it; it is
    unlinked once all have mapped it, so nothing stays in /dev/shm)."""
    name = _shm.segment_name(world.token, kind, 0)
    if world.rank == 0:
        m = _shm.create(name, nbytes)
    name = exchange(world, name if world.rank == 0 else None)[0]
    if world.rank != 0:
        m = _shm.open_existing(name, nbytes)
    keep.append(m)
    dist.barrier(group=world.cpu_group)
    if world.rank == 0:
        _shm.unlink(name)
    return m


def make_control(world: World, timeout: float, keep: list) -> ControlBlock:
    m = shared_block(world, "ctl", ControlBlock.nbytes(world.world_size), keep)
    return ControlBlock(m, world.rank, world.world_size, timeout)


def cpu_heap(world: World, layout: HeapLayout, timeout: float, keep: list):
    _shm.sweep_orphans()
    free = _shm.free_bytes()
    need = layout.size * world.world_size
    if free is not None and world.rank == 0 and need > free:
        # Pages are only backed when touched, but a world that outgrows /dev/shm dies of
        # SIGBUS; refuse up front instead.
        raise CommlabUsageError(
            f"commlab.init: heap_size {_fmt_bytes(layout.size)} x {world.world_size} ranks "
            f"needs {_fmt_bytes(need)} of /dev/shm, which has {_fmt_bytes(free)} free; pass "
            f"a smaller heap_size (e.g. heap_size='16MiB') or enlarge /dev/shm"
        )
    name = _shm.segment_name(world.token, "heap", world.rank)
    mine = _shm.create(name, layout.size)
    fd = _shm.OpenFd(name)  # kept: a grow maps this heap into newcomers (runtime/_grow)
    keep.append(fd)
    names = exchange(world, name)
    maps = [mine if r == world.rank else _shm.open_existing(n, layout.size)
            for r, n in enumerate(names)]
    keep.extend(maps)
    control = make_control(world, timeout, keep)  # has a barrier: all heaps are mapped
    _shm.unlink(name)
    bases = [_addr(m) for m in maps]
    local = torch.frombuffer(mine, dtype=torch.uint8)

    def make_block(off: int, nbytes: int):
        owner = (ctypes.c_uint8 * nbytes).from_buffer(mine, off)
        return owner, torch.frombuffer(owner, dtype=torch.uint8)

    heap = SymmetricHeap(layout, world.rank, bases, world.device, local, make_block)
    heap.fd = fd.fd
    return heap, control


class _CudaBlock:
    """Owns a sub-range of the CUDA heap; torch keeps it alive while a tensor uses it, and
    it keeps the heap (``owner``) alive in turn."""

    def __init__(self, ptr: int, nbytes: int, owner: object):
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
            "version": 3, "strides": None, "stream": None,
        }


def symmetric_memory():
    """torch's symmetric memory, which the cuda backend's heap is allocated with, on a
    CUDA build or a ROCm one (``torch.version.hip``) alike; CommlabUsageError naming the
    build and what it lacks where it is missing."""
    hip = getattr(torch.version, "hip", None)
    build = f"torch {torch.__version__}, " + (f"ROCm {hip}" if hip else
                                              f"CUDA {torch.version.cuda}")
    fix = "use a PyTorch build that has it, COMMLAB_HEAP=ipc, or COMMLAB_BACKEND=cpu"
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        raise CommlabUsageError(
            f"the cuda backend allocates its heap with torch.distributed._symmetric_memory, "
            f"which is not available on this build ({build}: {e}); {fix}") from e
    missing = [n for n in ("empty", "rendezvous") if not hasattr(symm_mem, n)]
    if missing:
        raise CommlabUsageError(
            f"torch.distributed._symmetric_memory on this build ({build}) lacks "
            f"{', '.join(missing)}, which the cuda backend's heap needs; {fix}")
    return symm_mem


def _cuda_blocks(world: World, layout: HeapLayout, bases: list[int], local: torch.Tensor,
                 owner: object, timeout: float, keep: list):
    local[: layout.scratch].zero_()  # signal pad and flags start at zero
    torch.cuda.synchronize(world.device)
    control = make_control(world, timeout, keep)  # its barrier also orders the zeroing

    def make_block(off: int, nbytes: int):
        block = _CudaBlock(bases[world.rank] + off, nbytes, owner)
        return block, torch.as_tensor(block, device=world.device)

    heap = SymmetricHeap(layout, world.rank, bases, world.device, local, make_block)
    return heap, control


def symmetric_heap(world: World, layout: HeapLayout, timeout: float, keep: list):
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # never multicast here
    symm_mem = symmetric_memory()
    buf = symm_mem.empty(layout.size, dtype=torch.uint8, device=world.device)
    hdl = symm_mem.rendezvous(buf, world.group.group_name)
    bases = [int(p) for p in hdl.buffer_ptrs]
    keep.extend([buf, hdl])
    return _cuda_blocks(world, layout, bases, buf, buf, timeout, keep)


def ipc_heap(world: World, layout: HeapLayout, timeout: float, keep: list):
    """The CUDA IPC heap (``runtime/_ipc_heap.py``): each rank's own allocation, every
    peer's opened through its handle. Freed when the Communicator and every symmetric
    tensor are gone (a tensor kept past ``finalize`` keeps its memory valid)."""
    from commlab.runtime._cuda_ipc import Driver
    from commlab.runtime._devices import identity
    from commlab.runtime._ipc_heap import IpcHeap

    index = world.device.index if world.device.index is not None else 0
    driver = Driver(index)
    words_buf = shared_block(world, "ipc", 16 * world.world_size, keep)
    words: Any = np.frombuffer(words_buf, dtype=np.int64)  # a MutableSequence of ints
    mapping = IpcHeap(driver, world.rank, world.world_size,
                      (layout.size, layout.scratch_bytes), identity(index),
                      lambda obj: exchange(world, obj), words,
                      close_wait=float(_config.get("COMMLAB_IPC_CLOSE_WAIT")))
    owner = _IpcOwner(mapping, driver)
    bases = list(mapping.bases)
    local = torch.as_tensor(_CudaBlock(bases[world.rank], layout.size, owner),
                            device=world.device)
    keep.append(owner)
    return _cuda_blocks(world, layout, bases, local, owner, timeout, keep)


class _IpcOwner:
    """Holds the IPC heap open; the last reference gone (the Communicator closed, no
    symmetric tensor left), it closes imports and frees in the heap's safe order."""

    def __init__(self, mapping, driver):
        self.mapping = mapping
        weakref.finalize(self, _close_ipc, mapping, driver)


def _close_ipc(mapping, driver) -> None:
    try:
        torch.cuda.synchronize(driver.index)  # no kernel of ours still reads a peer's heap
    except Exception:  # a broken context: closing still runs, the exit frees the rest
        pass
    mapping.close()  # its closed words live in a mapping the heap's exchange keeps
    driver.release()
