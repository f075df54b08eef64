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
    ACROSS_HOSTS,
    PENDING_STATE,
    _Aborted,
    _addr,
    _connect,
    _control_block,
    _install,
    _joins,
    _Round,
    _store_key,
    machine,
    unlink_round,
)
from commlab.runtime._kill_points import reach
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
    joins.set(f"ticket/{ticket}", json.dumps({"pid": os.getpid(), "machine": machine()}))
    admit = _admission(joins, ticket, time.monotonic() + timeout, timeout)
    gen, prefix, rank = admit["store"], admit["prefix"], admit["rank"]
    store = _auth.authenticated(dist.PrefixStore(f"commlab/{gen}", _bootstrap._STORES[key]),
                                f"commlab/{gen}")
    _bootstrap._GENERATIONS[key] = max(_bootstrap._GENERATIONS.get(key, 0), gen)
    w = json.loads(store.get(f"{prefix}/decision"))["world"]
    if w.get("hosts") is not None:  # a world across hosts (runtime/_grow_hosts)
        return ACROSS_HOSTS[0][1](store, prefix, rank, w, timeout)
    size, pids = w["size"], tuple(w["pids"])
    rnd = _Round(store, prefix, pids, rank, time.monotonic() + w["phase_s"])
    layout = HeapLayout(*w["layout"])
    name = _shm.segment_name(w["token"], "heap", rank)
    try:
        check_settings(rnd, w)
        mine = _shm.create(name, layout.size)
        fd = _shm.OpenFd(name)
        store.set(f"{prefix}/heap/{rank}", name)
        reach("join.map")
        maps = []
        try:
            maps = map_heaps(rnd, w, range(size), rank, mine, layout.size)
            block = _control_block(rnd, rank, w["token"], size)
        except OSError as e:
            raise rnd.fail(f"cannot map a peer's heap or the agreement block ({e}); "
                           f"newcomers must run as the same user on the members' host") \
                from None
        rnd.verdict()
    except _Aborted as e:
        unlink_round(w)
        raise CommlabError(f"commlab.init(join=True): the grow admitting this process as "
                           f"rank {rank} failed: {e}; call commlab.init(join=True) again "
                           f"to wait for the next grow") from None
    unlink_round(w)
    heap = _newcomer_heap(layout, rank, [_addr(mp) for mp in maps], mine, w["arena"])
    heap.fd = fd.fd
    members = Membership(rank, size, pids, store, w["store_rank"], w["generation"],
                         tuple(w["origin"]) + tuple(range(w["members"], size)),
                         w["timeout"], w["peer_timeout"], tuple(w["joined"]))
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
    _connect(comm, prefix, "join.commit")
    return comm


_CLAIMED_S = 10.0  # how long a claimed newcomer waits for its admission


def _admission(joins, ticket: int, deadline: float, timeout: float) -> dict:
    pause, claimed = 0.0005, False
    while True:
        reach("join.wait")
        if joins.check([f"admit/{ticket}"]):
            break
        if not claimed and joins.check([f"claim/{ticket}"]):
            claimed = True  # by a grow (or marked dead): its admission comes at once
            deadline = min(deadline, time.monotonic() + _CLAIMED_S)
        if time.monotonic() > deadline and claimed:
            raise CommlabError(
                f"commlab.init(join=True): a grow claimed ticket {ticket} and did not admit "
                f"it within {_CLAIMED_S:g} s (a member died while deciding); call "
                f"commlab.init(join=True) again to wait for the next grow")
        if time.monotonic() > deadline:  # withdraw, unless a grow claimed us just now
            got = joins.compare_set(f"claim/{ticket}", "", "withdrawn").decode()
            if got in ("withdrawn", "dead"):
                raise CollectiveTimeoutError(
                    f"commlab.init(join=True): not admitted within {timeout:g} s (ticket "
                    f"{ticket}); the members must call commlab.grow(n) (or run "
                    f"commlab.elastic.step) while this process waits; pass a longer "
                    f"timeout to wait longer")
            # claimed: the decider writes the admission at once, unless it died
            claimed, deadline = True, time.monotonic() + _CLAIMED_S
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


def check_settings(rnd: _Round, w: dict) -> None:
    """Fail the round when this newcomer's COMMLAB_* settings differ from the world's."""
    diffs = _settings.differences([w["settings"], _settings.settings({})])
    if diffs:
        raise rnd.fail(f"{'; '.join(diffs)} (rank 0 first, this newcomer second); set "
                       f"the world's COMMLAB_* values on the newcomer")


def map_heaps(rnd: _Round, w: dict, ranks, rank: int, mine, size: int) -> list:
    """A newcomer's mappings of the heaps of ``ranks`` (its own is ``mine``): a member's
    through its fd, another newcomer's by the name it published in the round."""
    maps = []
    for r in ranks:
        if r < w["members"]:
            pid, peer_fd = w["fds"][r]
            maps.append(_shm.open_peer_fd(pid, peer_fd, size))
        elif r == rank:
            maps.append(mine)
        else:
            maps.append(rnd.heap(r, size))
    return maps


def inherited(comm: _c.Communicator, offset: int, shape, dtype: torch.dtype):
    """The newcomer's block at ``offset`` as a tensor (it then lives like any symmetric
    tensor), or None when this rank holds no such block from its join."""
    raw = comm.heap.inherited.pop(offset, None)
    if raw is None:
        return None
    nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    return raw[:nbytes].view(dtype).view(tuple(shape))
