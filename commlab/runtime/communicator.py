"""``commlab.init``: one Communicator per process, with its symmetric heap and context."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from commlab import _config
from commlab._config import parse_size
from commlab._interpreter import bounds, liveness
from commlab.errors import (
    CommlabUsageError,
    HeapFullError,
)
from commlab.runtime import _heaps, _native, _publish, wait_records
from commlab.runtime._abort import AbortWatch
from commlab.runtime._beats import Beats
from commlab.runtime._bootstrap import World, bootstrap
from commlab.runtime._control import ControlBlock, Signature
from commlab.runtime._cross import HostsAgreement
from commlab.runtime._hosts import HostGroups, host_map, split
from commlab.runtime._settings import agree_settings
from commlab.runtime._watch import peer_watch
from commlab.runtime.heap import (
    FLAGS_BYTES,
    MAX_WORLD,
    SIGNAL_PAD_BYTES,
    HeapLayout,
    SymmetricHeap,
    _fmt_bytes,
)
from commlab.runtime.membership import Membership

_DEFAULTS = {  # backend -> (heap_size, scratch_size)
    "cpu": (64 << 20, 16 << 20),
    "cuda": (6 << 30, 4 << 30),
}


@dataclass
class Communicator:
    """A world of ranks sharing a symmetric heap.

    ``context`` is handed to kernels as ``ctx`` (see ``commlab.language``). In a world
    across hosts, ``local`` is this host's Communicator (its ``context`` is what kernels
    get) and ``hosts`` lists every host's global ranks; on one host ``local`` is itself.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    _context: torch.Tensor
    heap: SymmetricHeap
    control: ControlBlock | HostsAgreement
    group: dist.ProcessGroup
    cpu_group: dist.ProcessGroup
    local_rank: int = 0
    _world: World | None = field(default=None, repr=False)
    _keep: list = field(default_factory=list, repr=False)  # mappings kept alive
    plans: dict = field(default_factory=_native.Plans, repr=False)  # cached launch plans
    closed: bool = False
    _local: Communicator | None = field(default=None, repr=False)  # across hosts only
    across: HostGroups | None = field(default=None, repr=False)  # across hosts only
    wait_records: torch.Tensor | None = field(default=None, repr=False)  # GPU: wait_records
    abort_watch: AbortWatch | None = field(default=None, repr=False)  # GPU: sets its abort
    members: Membership | None = field(default=None, repr=False)  # who is alive (one host)
    records: Any = field(default=None, repr=False)  # runtime.records.Book, made at first use

    @property
    def generation(self) -> int:
        """How many times this world shrank (0 for the world ``init`` made)."""
        return self.members.generation if self.members is not None else 0

    @property
    def heap_kind(self) -> str:
        """Which heap this world has: "shm" (cpu), "symmetric" (torch's symmetric memory,
        one GPU per rank) or "ipc" (CUDA IPC, ranks sharing a GPU; ``COMMLAB_HEAP``)."""
        return self._world.heap if self._world is not None else "shm"

    @property
    def shared_gpu(self) -> str:
        """A line saying which ranks share a GPU and what that means, or "" (one each)."""
        return self._world.placement.describe() if self._world is not None else ""

    @property
    def local(self) -> Communicator:
        """The Communicator of this host's ranks (``self`` in a one-host world)."""
        return self if self._local is None else self._local

    @property
    def hosts(self) -> list[list[int]]:
        """The global ranks on each host (one list per host, hosts by first rank)."""
        return [list(range(self.world_size))] if self.across is None else self.across.hosts

    @property
    def context(self) -> torch.Tensor:
        if self._local is not None:
            raise CommlabUsageError(
                f"comm.context: this world spans {len(self.hosts)} hosts "
                f"({self.world_size} ranks) and a kernel can address only its host's ranks; "
                f"pass comm.local.context (ranks 0..{self._local.world_size - 1} of this host,"
                f" comm.local.rank {self._local.rank}) and use commlab's collectives for the"
                f" whole world")
        return self._context

    # -- views of the reserved regions ------------------------------------------------
    def scratch(self, nbytes: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """The staging scratch as a flat tensor of ``nbytes`` (same offset on every rank)."""
        lay = self.heap.layout
        if nbytes > lay.scratch_bytes:
            raise ValueError(f"scratch request {nbytes} > scratch size {lay.scratch_bytes}")
        return self.heap.region(lay.scratch, nbytes, dtype)

    @property
    def scratch_bytes(self) -> int:
        return self.heap.layout.scratch_bytes

    def synchronize(self) -> None:
        """Wait for this rank's device, after checking every call that ran ahead of the
        agreement (a mismatch found there raises the RankMismatchError every rank raises)."""
        self.control.settle()
        self._device_sync()
        if wait_records.aborted(self.wait_records) and self.members is not None:
            lost = self.members.lost(now=True)  # a kernel gave up: its result is void
            if lost:
                raise self.members.error(lost, "synchronize")

    def _device_sync(self) -> None:
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)

    # -- lifecycle ----------------------------------------------------------------------
    def recover(self) -> None:
        """Bring every rank back to a clean state after an interrupted collective.

        Collective: every rank calls it (the notebook engine does after Ctrl-C or a hang
        report). Clears the signal pad, the flags and the agreement sequence."""
        if self._local is not None:  # across hosts: each host's, between two world barriers
            dist.barrier(group=self.cpu_group)
            self._local.recover()
            dist.barrier(group=self.cpu_group)
            return
        dist.barrier(group=self.cpu_group)
        self._device_sync()  # calls that ran ahead are forgotten, not checked
        lay = self.heap.layout
        self.heap.region(lay.signal_pad, SIGNAL_PAD_BYTES + FLAGS_BYTES, torch.uint8).zero_()
        self.records = None  # the call records were zeroed with the flags
        self.plans.clear()  # they hold the old Book (remade at the next call)
        self.control.reset()
        self._device_sync()
        dist.barrier(group=self.cpu_group)

    def close(self) -> None:
        """Release the heap and the process group (``commlab.finalize()`` calls this)."""
        global _COMM
        if self.closed:
            return
        self.closed = True
        try:
            self._device_sync()  # no check of calls that ran ahead: peers may be gone
        except Exception:  # a broken device must not stop the rest of the cleanup
            pass
        if isinstance(self.control, ControlBlock):  # our part of every call is done
            self.control.leave()
        if self.members is not None:  # the store's server stays until the peers are done
            self.members.leave()
        if self._local is not None:
            self._local.close()
        self.heap.closed = True
        if self.backend == "cpu" and self.across is None:
            liveness.set_watch(None)
        if self.abort_watch is not None:
            self.abort_watch.stop()
        self.plans.clear()
        self.control.ahead.drains.clear()
        self._keep.clear()
        if self._world is not None and self._world.owns_pg and dist.is_initialized():
            dist.destroy_process_group()
        if _COMM is self:
            _COMM = None

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend!r}, device={self.device}, "
                f"heap={_fmt_bytes(self.heap.size)} {self.heap_kind})")


_COMM: Communicator | None = None
_HEAP_FULL = "symmetric heap full:"  # how Arena.alloc's HeapFullError begins


# runtime/_grow.join, registered when commlab.runtime is imported (it imports this module)
JOIN: list = [None]


def init(backend: str = "auto", *, heap_size=None, scratch_size=None,
         timeout: float | None = None, join: bool = False) -> Communicator:
    """Join the world and build the symmetric heap; return the process's Communicator.

    backend: "auto" (cuda when every rank has a GPU), "cpu" (Triton's interpreter, ranks
    as processes sharing memory) or "cuda". heap_size / scratch_size: bytes or strings
    like "256MiB" (defaults: COMMLAB_HEAP_SIZE, else 64 MiB on cpu, 6 GiB on cuda, less
    where ranks share a GPU: at most a quarter of its memory over the ranks sharing it).
    timeout: seconds a collective waits for missing ranks before raising (default
    COMMLAB_TIMEOUT, else 300). Calling init again returns the same communicator.
    join: enter a running world (its store in the environment; RANK and WORLD_SIZE are
    ignored; ``COMMLAB_JOIN=1`` means the same): blocks until the members call
    ``commlab.grow`` (at most ``timeout`` s) and returns the grown world's Communicator;
    the heap's layout is the world's.
    """
    global _COMM
    if _COMM is not None and not _COMM.closed:
        if backend not in ("auto", _COMM.backend):
            raise CommlabUsageError(
                f"commlab.init(backend={backend!r}): this process already has a "
                f"{_COMM.backend!r} communicator; call commlab.finalize() first to switch"
            )
        return _COMM
    join = join or bool(_config.get("COMMLAB_JOIN"))  # python -m commlab.run's replacements
    timeout = float(timeout if timeout is not None else _config.get("COMMLAB_TIMEOUT"))
    if join:
        _COMM = JOIN[0](backend, timeout)
        return _COMM
    world = bootstrap(backend, timeout)
    if world.backend == "cpu":
        from commlab._interpreter import triton_lib as _triton_lib

        _triton_lib.adopt(all_modules=True)  # kernels a script defined before the import
    if world.world_size > MAX_WORLD:
        raise CommlabUsageError(f"commlab supports up to {MAX_WORLD} ranks, got {world.world_size}")
    d_heap, d_scratch = _DEFAULTS[world.backend]
    if world.backend == "cuda" and world.placement.shared:
        d_heap = _shared_heap_default(world)
    size = parse_size(heap_size or _config.get("COMMLAB_HEAP_SIZE") or d_heap)
    scratch = parse_size(scratch_size or _config.get("COMMLAB_SCRATCH_SIZE")
                         or min(d_scratch, size // 2))
    layout = HeapLayout(size=size, scratch_bytes=scratch)
    layout.check()
    agree_settings(world, {"heap_size": size, "scratch_size": scratch, "timeout": timeout})
    hosts = host_map(world)  # probed: which ranks share memory
    if len(hosts) > 1:
        comm = _across_hosts(world, hosts, layout, timeout)
        _COMM = comm
        return comm
    comm = _one_host(world, layout, timeout)
    if world.rank == 0 and world.placement.shared and world.backend == "cuda":
        print(f"commlab: {world.placement.describe()}", file=sys.stderr, flush=True)
    _COMM = comm
    return comm


def _shared_heap_default(world: World) -> int:
    """The default heap on a GPU that ``k`` ranks share: at most a quarter of the GPU's
    memory over ``k`` (each rank also has its own CUDA context and caching allocator),
    a multiple of 256 MiB, between 256 MiB and the usual 6 GiB."""
    k = max(len(g) for g in world.placement.groups())
    total = torch.cuda.get_device_properties(world.device).total_memory
    share = total // (4 * k) // (256 << 20) * (256 << 20)
    return max(256 << 20, min(_DEFAULTS["cuda"][0], share))


def _one_host(world: World, layout: HeapLayout, timeout: float) -> Communicator:
    """The Communicator of ranks that share memory: one heap, one agreement block."""
    keep: list = []
    build = {"shm": _heaps.cpu_heap, "symmetric": _heaps.symmetric_heap,
             "ipc": _heaps.ipc_heap}[world.heap]
    heap, control = build(world, layout, timeout, keep)
    records, records_addr = wait_records.allocate(world.device)
    ctx = torch.tensor(
        [world.rank, world.world_size, heap.bases[world.rank] + layout.signal_pad,
         heap.bases[world.rank] + layout.flags] + heap.bases + [records_addr],
        dtype=torch.int64, device=world.device,
    )
    comm = Communicator(world.rank, world.world_size, world.backend, world.device, ctx, heap,
                        control, world.group, world.cpu_group, world.local_rank, world, keep,
                        wait_records=records)
    pids = tuple(_heaps.exchange(world, os.getpid()))
    comm.members = control.members = Membership(
        world.rank, world.world_size, pids, world.store, world.store_rank, timeout=timeout)
    if world.backend == "cpu":
        bounds.set_heap_size(layout.size)
    watch_kernels(comm)
    return comm


def watch_kernels(comm: Communicator) -> None:
    """This process's kernels notice a lost member of ``comm``: interpreted kernels'
    waits check the members and the timeout; on a GPU a thread sets the abort word."""
    control = comm.control
    assert comm.members is not None and isinstance(control, ControlBlock)
    if comm.backend == "cuda":
        comm.abort_watch = AbortWatch(comm.members, comm.wait_records)
        return
    comm.members.departed = control.left_after  # a member done with a call is not lost in it
    liveness.set_watch(peer_watch(comm.members, control.timeout,
                                  lambda: (control._inside[1] or "", control.seq)))


def _across_hosts(world: World, hosts: list[list[int]], layout: HeapLayout,
                  timeout: float) -> Communicator:
    """A world across hosts: one heap per host (this host's Communicator is ``local``);
    the world's agreement is the host's block plus an exchange between hosts."""
    local_world, groups = split(world, hosts, timeout)
    local = _one_host(local_world, layout, timeout)
    assert isinstance(local.control, ControlBlock)
    assert local.members is not None
    local.members.store = None  # each host's keys would meet in the world's one store
    host_of = tuple(next(h for h, rs in enumerate(hosts) if r in rs)
                    for r in range(world.world_size))
    # the world's members: this host's by their pids, the others' by heartbeats
    members = Membership(world.rank, world.world_size, tuple(_heaps.exchange(world, os.getpid())),
                         world.store, world.store_rank, timeout=timeout, hosts=host_of)
    if world.store is not None:
        others = [r for r in range(world.world_size) if host_of[r] != host_of[world.rank]]
        members.beats = Beats(world.store, world.rank, others, members.peer_timeout)
        # every wait of this host (its agreement, its kernels) looks at the whole world:
        # a host gone fails them all, as one lost member does on one host
        block = local.control
        block.members = members
        liveness.set_watch(peer_watch(members, block.timeout,
                                      lambda: (block._inside[1] or "", block.seq)))
    control = HostsAgreement(local.control, hosts, groups.host, groups.cross_hosts,
                             groups.cross_group, members)
    return Communicator(world.rank, world.world_size, world.backend, world.device,
                        local._context, local.heap, control, world.group, world.cpu_group,
                        world.local_rank, world, [], _local=local, across=groups,
                        members=members)


def install(comm: Communicator) -> None:
    """Make ``comm`` this process's communicator (``commlab.shrink()``'s result)."""
    global _COMM
    _COMM = comm


@contextlib.contextmanager
def using(comm: Communicator):
    """Make ``comm`` this process's communicator for the block (the hierarchical
    collectives run a host's part through the public path on ``comm.local``)."""
    global _COMM
    before, _COMM = _COMM, comm
    try:
        yield comm
    finally:
        _COMM = before


def current_communicator() -> Communicator | None:
    """This process's open communicator, or None (for code that also runs without one)."""
    return _COMM if _COMM is not None and not _COMM.closed else None


publishes_local_errors = _publish.published(current_communicator)

def get_communicator() -> Communicator:
    """This process's open communicator; raises CommlabUsageError before ``init``."""
    if _COMM is None or _COMM.closed:
        raise CommlabUsageError(
            "no communicator: call comm = commlab.init() first (inside %%distributed cells "
            "the engine has done it for you)"
        )
    return _COMM


def finalize() -> None:
    """Close this process's communicator, if any (idempotent)."""
    if _COMM is not None:
        _COMM.close()


atexit.register(finalize)


@publishes_local_errors()
def symmetric_empty(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor in the symmetric heap: the same offset on every rank, so kernels can reach
    a peer's copy with ``cl.symm_at``. Collective: every rank allocates in the same order.

    A block returns to the arena when its last tensor dies, which for a tensor held in a
    reference cycle is whenever Python's cyclic GC runs: a different moment on each rank.
    So when the offsets differ but the arguments agree, every rank collects its garbage
    and allocates again; only a tensor alive on some ranks only still makes them differ."""
    comm = get_communicator()
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise CommlabUsageError(f"symmetric_empty: shape must be non-negative, got {shape}")
    dname = str(dtype).replace("torch.", "")
    try:
        t, off, err = *comm.heap.allocate(shape, dtype), ""
    except HeapFullError as e:  # published, so every rank raises it and stays in step
        t, off, err = None, -1, str(e)
    try:
        comm.control.agree(Signature(
            "symmetric_empty", {"shape": shape, "dtype": dname, "heap offset": off}, err))
        assert t is not None  # a full heap on this rank (t None) published err: agree raised
        return t
    except CommlabUsageError as e:  # a mismatch, or the same error on every rank
        del t  # a failed allocation keeps no block, even while its traceback lives
        if err or _HEAP_FULL in str(e):  # one type everywhere: the full rank's
            raise HeapFullError(str(e)) from None
        if "heap offset differs" not in str(e):  # every rank saw the same signatures
            raise
    except BaseException:
        del t
        raise
    # every rank is here: the arguments or the offsets differ; the arguments decide which
    comm.control.agree(Signature("symmetric_empty", {"shape": shape, "dtype": dname}))
    gc.collect()  # blocks dead in reference cycles return to the arena on every rank
    t, off = comm.heap.allocate(shape, dtype)
    try:
        comm.control.agree(Signature(
            "symmetric_empty", {"shape": shape, "dtype": dname, "heap offset": off},
            hints={"heap offset": "the ranks hold different symmetric tensors (one freed, "
                                  "or kept alive by rank-dependent code, on some ranks only); "
                                  "allocate and free symmetric tensors in the same order on "
                                  "every rank"},
        ))
    except BaseException:
        del t
        raise
    return t


@publishes_local_errors("symmetric_empty")  # its first agreement is symmetric_empty's
def symmetric_zeros(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Like symmetric_empty, filled with zeros (every rank's zeros are written on return:
    each rank zeroes its copy, waits for its device, then meets the others)."""
    comm = get_communicator()
    t = symmetric_empty(shape, dtype)
    t.zero_()
    comm.synchronize()  # our zeros (and all our earlier work) are in memory
    comm.control.agree(Signature("symmetric_zeros", {}))  # peers may now read our zeros
    return t
