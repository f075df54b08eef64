"""``commlab.init(join=True)``: a newcomer registers at the world's store, waits to be
admitted by the members' ``commlab.grow`` and maps the world (the protocol: ``_grow``).

The newcomer's heap layout, timeout and agreed settings are the world's (a COMMLAB_*
setting that shapes the protocol and differs fails the grow on every rank). Its arena is
member 0's: every block the members hold is held here too (``heap.inherited``, zeros)
until ``commlab.elastic.State`` hands it out with the sender's contents.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
import weakref
from typing import cast

import torch
import torch.distributed as dist

from commlab.errors import CollectiveTimeoutError, CommlabError, CommlabUsageError
from commlab.runtime import _auth, _bootstrap, _settings, _shm
from commlab.runtime import communicator as _c
from commlab.runtime._devices import Placement
from commlab.runtime._grow import (
    PENDING_STATE,
    _Aborted,
    _addr,
    _connect,
    _control_block,
    _install,
    _joins,
    _Round,
    _store_key,
)
from commlab.runtime.heap import HeapLayout, SymmetricHeap
from commlab.runtime.membership import Membership


def join(backend: str, timeout: float) -> _c.Communicator:
    """``commlab.init(join=True)``: register, wait to be admitted, map the world."""
    if backend == "cuda":
        raise CommlabUsageError("commlab.init(join=True): the cuda backend cannot grow yet; "
                                "use backend='cpu'")
    _bootstrap._check_compiled_mode("cpu")
    key = _store_key()
    joins = _joins(key, timeout)
    ticket = joins.add("tickets", 1)
    joins.set(f"ticket/{ticket}", json.dumps({"pid": os.getpid()}))
    admit = _admission(joins, ticket, time.monotonic() + timeout, timeout)
    gen, prefix, rank = admit["store"], admit["prefix"], admit["rank"]
    store = _auth.authenticated(dist.PrefixStore(f"commlab/{gen}", _bootstrap._STORES[key]),
                                f"commlab/{gen}")
    _bootstrap._GENERATIONS[key] = max(_bootstrap._GENERATIONS.get(key, 0), gen)
    w = json.loads(store.get(f"{prefix}/decision"))["world"]
    size, pids = w["size"], tuple(w["pids"])
    rnd = _Round(store, prefix, pids, rank, time.monotonic() + w["phase_s"])
    layout = HeapLayout(*w["layout"])
    name = _shm.segment_name(w["token"], "heap", rank)
    try:
        diffs = _settings.differences([w["settings"], _settings.settings({})])
        if diffs:
            raise rnd.fail(f"{'; '.join(diffs)} (rank 0 first, this newcomer second); set "
                           f"the world's COMMLAB_* values on the newcomer")
        mine = _shm.create(name, layout.size)
        fd = _shm.OpenFd(name)
        store.set(f"{prefix}/heap/{rank}", name)
        maps = []
        try:
            for r in range(size):
                if r < w["members"]:
                    pid, peer_fd = w["fds"][r]
                    maps.append(_shm.open_peer_fd(pid, peer_fd, layout.size))
                elif r == rank:
                    maps.append(mine)
                else:
                    other = rnd.wait(f"heap/{r}", f"rank {r}'s heap").decode()
                    maps.append(_shm.open_existing(other, layout.size))
        except OSError as e:
            raise rnd.fail(f"cannot map a peer's heap ({e}); newcomers must run as the same "
                           f"user on the members' host") from None
        block = _control_block(rnd, rank, w["token"], size)
        rnd.verdict()
    except _Aborted as e:
        _shm.unlink(name)
        raise CommlabError(f"commlab.init(join=True): the grow admitting this process as "
                           f"rank {rank} failed: {e}; call commlab.init(join=True) again "
                           f"to wait for the next grow") from None
    _shm.unlink(name)
    heap = _newcomer_heap(layout, rank, [_addr(mp) for mp in maps], mine, w["arena"])
    heap.fd = fd.fd
    members = Membership(rank, size, pids, store, w["store_rank"], w["generation"],
                         tuple(w["origin"]) + tuple(range(w["members"], size)),
                         w["timeout"], w["peer_timeout"])
    no_group = cast(dist.ProcessGroup, None)  # set by _connect
    world = _bootstrap.World(rank, size, rank, "cpu", torch.device("cpu"), no_group,
                             no_group, w["token"], True, Placement(("",) * size), "shm",
                             store, w["store_rank"])
    from commlab._interpreter import bounds
    from commlab._interpreter import triton_lib as _triton_lib

    _triton_lib.adopt(all_modules=True)  # kernels a script defined before the import
    bounds.set_heap_size(layout.size)
    comm = _install(members, heap, block, w["timeout"], world, maps + [block, fd])
    PENDING_STATE[0] = True
    _connect(comm, prefix)
    return comm


def _admission(joins, ticket: int, deadline: float, timeout: float) -> dict:
    pause = 0.0005
    while not joins.check([f"admit/{ticket}"]):
        if time.monotonic() > deadline:  # withdraw, unless a grow claimed us just now
            got = joins.compare_set(f"claim/{ticket}", "", "withdrawn").decode()
            if got in ("withdrawn", "dead"):
                raise CollectiveTimeoutError(
                    f"commlab.init(join=True): not admitted within {timeout:g} s (ticket "
                    f"{ticket}); the members must call commlab.grow(n) (or run "
                    f"commlab.elastic.step) while this process waits; pass a longer "
                    f"timeout to wait longer")
            deadline = float("inf")  # claimed: the admission follows at once
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    admit = json.loads(joins.get(f"admit/{ticket}"))
    if "abort" in admit:
        raise CommlabError(f"commlab.init(join=True): {admit['abort']}; call "
                           f"commlab.init(join=True) again to wait for the next grow")
    return admit


def _newcomer_heap(layout: HeapLayout, rank: int, bases: list[int], mine,
                   arena: dict) -> SymmetricHeap:
    """This newcomer's heap: zeros, its arena the members' (their blocks held as
    ``heap.inherited``)."""
    local = torch.frombuffer(mine, dtype=torch.uint8)

    def make_block(off: int, nbytes: int):
        owner = (ctypes.c_uint8 * nbytes).from_buffer(mine, off)
        return owner, torch.frombuffer(owner, dtype=torch.uint8)

    heap = SymmetricHeap(layout, rank, bases, torch.device("cpu"), local, make_block)
    heap.arena._free = [(o, s) for o, s in arena["free"]]
    heap.arena._used = {o: s for o, s in arena["used"]}
    for off, nbytes in arena["used"]:
        owner, raw = make_block(off, nbytes)
        weakref.finalize(owner, heap._release, off)
        heap.inherited[off] = raw
    return heap


_c.JOIN[0] = join
