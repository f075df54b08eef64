"""Bootstrap through torch.distributed: rendezvous, backend agreement, process groups.

Reads the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). Without it, and with no process group already made, the world is this
one process (rank 0 of 1), which is handy for teaching and for a first try.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from commlab import _config
from commlab.errors import BackendUnavailableError, CommlabUsageError
from commlab.runtime import _auth
from commlab.runtime._devices import Placement, device_index, identity


@dataclass
class World:
    rank: int
    world_size: int
    local_rank: int
    backend: str  # "cpu" | "cuda"
    device: torch.device
    group: dist.ProcessGroup  # default process group (gloo, or gloo+nccl)
    cpu_group: dist.ProcessGroup  # a gloo group for host-side exchanges
    token: str  # shared random hex string naming this world's shm segments
    owns_pg: bool
    placement: Placement = field(default_factory=lambda: Placement(()))  # ranks' GPUs
    heap: str = "shm"  # "shm" (cpu) | "symmetric" | "ipc" (cuda): which heap init builds
    store: dist.Store | None = None  # this generation's (prefixed, MACed) store: shrink's
    store_rank: int | None = None  # the rank whose process serves it (None: a launcher)


# The TCPStore outlives finalize(): rank 0's store serves MASTER_PORT, so a second
# init() in the same processes must reuse it (a new server would find the port taken).
# Each bootstrap on a store uses fresh keys under its own generation: every rank of a
# world counts the bootstraps *on that store* the same way, also a world that mixes
# surviving processes with fresh ones on a new MASTER_PORT (the notebook's resize).
_STORES: dict[tuple[str, int], dist.Store] = {}
_GENERATIONS: dict[object, int] = {}
_SOCKETS: list[socket.socket] = []  # the stores' listening sockets

# A torch.distributed backend built on commlab (commlab.torch_backend) names the groups
# the Communicator of its default group uses; None when the default group is not its own.
_GROUP_SOURCE = None


def set_group_source(fn) -> None:
    """``fn(backend) -> (backend, group, cpu_group) | None``, asked when torch.distributed
    is already initialised: the backend (``"cpu"``/``"cuda"``) and the gloo/NCCL groups
    the Communicator should use in place of the default group."""
    global _GROUP_SOURCE
    _GROUP_SOURCE = fn


def _listen(addr: str, port: int) -> socket.socket:
    """A socket listening on MASTER_ADDR only (torch's own server would listen on every
    interface): on one host the store is out of other machines' reach. Kept open with the
    store."""
    host = socket.gethostbyname(addr)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    _SOCKETS.append(sock)
    return sock


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _gpu_of(local_rank: int) -> str:
    """This rank's GPU identity ("" without a GPU)."""
    index = device_index(local_rank)
    return "" if index is None else identity(index)


def bootstrap(backend: str, timeout_s: float) -> World:
    if backend not in ("auto", "cpu", "cuda"):
        raise CommlabUsageError(
            f"commlab.init: backend must be 'auto', 'cpu' or 'cuda', got {backend!r}"
        )
    timeout = timedelta(seconds=max(timeout_s, 30))
    if dist.is_initialized():
        return _from_existing(backend)
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    if rank is None or world_size is None:
        rank, world_size, local_rank = 0, 1, 0
        store: dist.Store = dist.HashStore()
        key = None  # a private store: generations start again
        agent_store = True  # nobody's death takes it
    else:
        env_local = _env_int("LOCAL_RANK")
        local_rank = rank if env_local is None else env_local
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = _env_int("MASTER_PORT")
        if port is None:
            raise CommlabUsageError(
                "commlab.init: RANK and WORLD_SIZE are set but MASTER_PORT is not; "
                "start the ranks with torchrun, or set MASTER_ADDR and MASTER_PORT"
            )
        # under torchrun the agent already serves the store on MASTER_PORT
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        key = (addr, port)
        if key not in _STORES:
            master = rank == 0 and not agent_store
            extra: dict[str, Any] = (
                {"master_listen_fd": _listen(addr, port).fileno()} if master else {})
            _STORES[key] = dist.TCPStore(addr, port, world_size, is_master=master,
                                         timeout=timeout, **extra)
        store = _STORES[key]
    _GENERATIONS[key] = generation = _GENERATIONS.get(key, 0) + 1 if key else 1
    store = dist.PrefixStore(f"commlab/{generation}", store)
    if key is not None:  # a TCPStore others may reach: trust only MACed values
        store = _auth.authenticated(store, f"commlab/{generation}")

    chosen, placement = _agree_backend(store, rank, world_size, local_rank, backend)
    heap = placement.heap() if chosen == "cuda" else "shm"
    if chosen == "cuda":
        device = torch.device("cuda", device_index(local_rank) or 0)
        torch.cuda.set_device(device)
        # NCCL refuses a GPU given twice ("Duplicate GPU"): ranks sharing one use gloo only
        pg_backend = "gloo" if placement.shared else "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        pg_backend = "gloo"
    if rank == 0:
        store.set("token", uuid.uuid4().hex[:12])
    token = store.get("token").decode()
    if _config.get("COMMLAB_TORCH_BACKEND") == "commlab":  # torch.distributed on commlab
        pg_backend = "commlab" if chosen == "cpu" else "cpu:gloo,cuda:commlab"
    # device_id binds NCCL to the GPU at once: only where NCCL may have it
    eager_nccl = chosen == "cuda" and not placement.shared and "nccl" in pg_backend
    kwargs: dict[str, Any] = {"device_id": device} if eager_nccl else {}
    dist.init_process_group(
        pg_backend,
        store=dist.PrefixStore("pg", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        **kwargs,
    )
    world_pg = dist.group.WORLD
    assert world_pg is not None  # init_process_group above has just set it
    group = cpu_group = world_pg
    adopted = _GROUP_SOURCE(chosen) if _GROUP_SOURCE is not None else None
    if adopted is not None:
        _, group, cpu_group = adopted
    return World(rank, world_size, local_rank, chosen, device, group, cpu_group, token, True,
                 placement, heap, store, None if agent_store else 0)


def _agree_backend(store, rank: int, world_size: int, local_rank: int,
                   wanted: str) -> tuple[str, Placement]:
    """The backend every rank uses, and which GPU each rank has (its identity, or "")."""
    from commlab import _interpreter as _interpret

    # a rank that will run on the CPU does not touch CUDA (no driver state in its process)
    maybe_cuda = wanted == "cuda" or (wanted == "auto" and not _interpret.interpreting())
    store.set(f"gpu/{rank}", _gpu_of(local_rank) if maybe_cuda else "")
    gpus = tuple(store.get(f"gpu/{r}").decode() for r in range(world_size))
    without = [r for r, g in enumerate(gpus) if not g]
    if wanted == "cuda" and without:
        raise BackendUnavailableError(
            f"commlab.init(backend='cuda'): {'rank' if len(without) == 1 else 'ranks'} "
            f"{', '.join(map(str, without))} see no CUDA GPU "
            f"(torch.cuda.device_count() is {torch.cuda.device_count()} here); "
            f"use backend='cpu', or give every rank a GPU"
        )
    placement = Placement(gpus)
    if wanted == "auto" and _interpret.interpreting():
        return "cpu", placement  # the interpreter was chosen at import: kernels run on CPU
    if wanted == "cuda" or (wanted == "auto" and not without):
        _check_compiled_mode("cuda")
        return "cuda", placement
    _check_compiled_mode("cpu")
    return "cpu", placement


def _check_compiled_mode(backend: str) -> None:
    from commlab import _interpreter as _interpret

    if backend == "cpu" and not _interpret.interpreting():
        raise BackendUnavailableError(
            "commlab.init(backend='cpu'): Triton's interpreter was off when commlab was "
            "imported (a GPU is visible), so kernels were compiled for the GPU; set "
            "COMMLAB_BACKEND=cpu (or TRITON_INTERPRET=1) before `import commlab`"
        )
    if backend == "cuda" and _interpret.interpreting():
        raise BackendUnavailableError(
            "commlab.init(backend='cuda'): TRITON_INTERPRET is on, so kernels run on the "
            "CPU; unset TRITON_INTERPRET and COMMLAB_BACKEND=cpu before `import commlab`"
        )


def _from_existing(backend: str) -> World:
    adopted = _GROUP_SOURCE(backend) if _GROUP_SOURCE is not None else None
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = _env_int("LOCAL_RANK")
    local_rank = rank if local_rank is None else local_rank
    pg_backend = str(dist.get_backend()).lower()
    has_nccl = "nccl" in pg_backend
    if adopted is not None:
        backend = adopted[0]
    if backend == "auto":
        backend = "cuda" if has_nccl else "cpu"
    if backend == "cuda" and device_index(local_rank) is None:
        raise BackendUnavailableError(
            f"commlab.init(backend='cuda'): rank {rank} sees no CUDA GPU; use backend='cpu'"
        )
    _check_compiled_mode(backend)
    world_pg = dist.group.WORLD
    assert world_pg is not None  # dist.is_initialized() held before _from_existing
    group = world_pg
    if adopted is not None:
        _, group, cpu_group = adopted
    elif "gloo" in pg_backend:
        cpu_group = group
    else:
        cpu_group = dist.new_group(backend="gloo")
    device = torch.device("cpu")
    if backend == "cuda":
        device = torch.device("cuda", device_index(local_rank) or 0)
        torch.cuda.set_device(device)
    placement = gather_placement(local_rank if backend == "cuda" else None, cpu_group)
    heap = placement.heap() if backend == "cuda" else "shm"
    obj = [uuid.uuid4().hex[:12] if rank == 0 else None]
    dist.broadcast_object_list(obj, src=0, group=cpu_group)
    token = obj[0]
    assert token is not None  # broadcast from rank 0, which set it
    # the default group's store, for commlab.shrink(): rank 0 serves it unless torchrun's
    # agent (or another launcher) does
    store: dist.Store = dist.PrefixStore(f"commlab/torch/{token}",
                                         dist.distributed_c10d._get_default_store())
    store = _auth.authenticated(store, f"commlab/torch/{token}")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return World(rank, world_size, local_rank, backend, device, group, cpu_group, token,
                 False, placement, heap, store, None if agent_store else 0)


def gather_placement(local_rank: int | None, group) -> Placement:
    """Every rank's GPU identity through ``group`` (collective); ``local_rank`` None: this
    rank runs on the CPU."""
    mine = "" if local_rank is None else _gpu_of(local_rank)
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, mine, group=group)
    return Placement(tuple(out))
