"""``commlab.grow`` and ``commlab.init(join=True)`` in a world across hosts (cpu).

The round is ``_grow``'s (arrive, decide, map, verdict, go) with three differences:

- **Where a newcomer lands.** Every member arrives with a probe segment in its host's
  /dev/shm (name and nonce in its arrival). A newcomer opens them and joins the host
  whose members it can read (hosts split on one machine, ``COMMLAB_HOSTS``: the
  smallest of them, the first on a tie) and writes ``host/<r>`` with its machine
  (hostname and boot id). Newcomers that read none make new hosts, one per machine,
  after the old ones.
- **What is mapped.** Only a host that gains ranks changes: its members map the
  newcomers' heaps by name, its newcomers map its members' through ``/proc/<pid>/fd``,
  and its local rank 0 (a member) makes its grown agreement block. Other hosts keep
  heap and block.
- **Who is gone.** Members on other hosts by heartbeats (``Membership.lost``); a
  newcomer, and on the newcomer's side anyone, through ``/proc`` only on its own
  machine (elsewhere the round's deadline covers it).

On go every rank installs the grown world (placeholder groups: a loss while connecting
is a ``RankLostError`` of the grown world, and ``shrink()`` works from it), connects the
default group and then the hosts' groups in one watched thread, and fills them in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import cast

import torch
import torch.distributed as dist

from commlab.errors import CollectiveTimeoutError, CommlabError
from commlab.runtime import _bootstrap, _shm
from commlab.runtime import communicator as _c
from commlab.runtime._beats import Beats
from commlab.runtime._control import ControlBlock
from commlab.runtime._cross import HostsAgreement
from commlab.runtime._devices import Placement
from commlab.runtime._grow import (
    ACROSS_HOSTS,
    PENDING_STATE,
    _Aborted,
    _addr,
    _decide,
    _member_wait,
    _Round,
    begin,
    connect_group,
    machine,
)
from commlab.runtime._hosts import HostGroups, make_groups
from commlab.runtime._join import _newcomer_heap, check_settings, map_heaps
from commlab.runtime._kill_points import reach
from commlab.runtime._shrink_hosts import assemble
from commlab.runtime.heap import FLAGS_BYTES, SIGNAL_PAD_BYTES, HeapLayout
from commlab.runtime.membership import Membership, alive, joined_keys


def _gone(rnd: _Round, w: dict, m: Membership | None):
    """``_Round``'s check of rank r: a member through ``m`` (a member's side), anyone
    else through ``/proc`` when on this machine."""
    here = machine()
    where = {r: a["machine"] for r, a in enumerate(w["arrivals"])}

    def gone(r: int) -> bool:
        if m is not None and r < m.world_size:
            return r in m.lost()
        if r not in where and rnd.store.check([f"{rnd.prefix}/host/{r}"]):
            where[r] = json.loads(rnd.store.get(f"{rnd.prefix}/host/{r}"))["machine"]
        return where.get(r) == here and not alive(rnd.pids[r])

    return gone


_DIED = re.compile(r"rank (\d+) \(pid \d+\) died during the grow")


def _member_died(m: Membership, verdict: str) -> list[int]:
    """The members lost, after an abort. One that names a member's death waits until
    this rank sees it too (another host's member: up to the peer timeout and two
    beats), so every member raises the same RankLostError."""
    named = _DIED.search(verdict)
    patience = m.peer_timeout + (2.5 * m.beats.every if m.beats is not None else 0.0)
    deadline = time.monotonic() + (patience if named and int(named[1]) < m.world_size
                                   else 0.0)
    while True:
        lost = m.lost(now=True)
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.01)


def _grown_hosts(rnd: _Round, w: dict) -> list[list[int]]:
    """Every host's ranks after the grow (each newcomer's ``host/<r>`` appended; those
    on machines without members on new hosts, one per machine)."""
    hosts = [list(h) for h in w["hosts"]]
    fresh: dict[str, int] = {}  # machine -> its new host
    for r in range(w["members"], w["size"]):
        place = json.loads(rnd.wait(f"host/{r}", f"rank {r}'s host"))
        h = place["host"]
        if h < 0:
            h = fresh.setdefault(place["machine"], len(hosts))
            if h == len(hosts):
                hosts.append([])
        hosts[h].append(r)
    return hosts


def _host_block(rnd: _Round, w: dict, hosts: list[list[int]], h: int, rank: int):
    """Host ``h``'s grown agreement block: its first rank makes it (a member; on a new
    host a newcomer)."""
    nbytes = ControlBlock.nbytes(len(hosts[h]))
    if rank == hosts[h][0]:
        name = _shm.segment_name(w["token"], f"grow{h}", 0)
        block = _shm.create(name, nbytes)
        rnd.store.set(f"{rnd.prefix}/ctl/{h}", name)
        return block
    name = rnd.wait(f"ctl/{h}", f"host {h}'s agreement block").decode()
    return _shm.open_existing(name, nbytes)


def _unlink(w: dict, hosts: list[list[int]] | None = None) -> None:
    """The round's segments that are on this machine: newcomers' heaps, grown blocks
    (of ``hosts``, the grown ones where known), members' probes (a name of another
    machine is simply not found)."""
    pids, token = w["pids"], w["token"]
    for r in range(w["members"], w["size"]):
        _shm.unlink(_shm.segment_name(token, "heap", r, pids[r]))
    for h, ranks in enumerate(hosts or w["hosts"]):
        _shm.unlink(_shm.segment_name(token, f"grow{h}", 0, pids[ranks[0]]))
    for a in w["arrivals"]:
        _shm.unlink(a["probe"])


def _placeholder(hosts: list[list[int]], rank: int) -> HostGroups:
    """The grown world's place before its groups connect (all ``shrink()`` needs)."""
    host = next(i for i, h in enumerate(hosts) if rank in h)
    return HostGroups(hosts, host, hosts[host].index(rank), [], [],
                      cast(dist.ProcessGroup, None))


def _members(w: dict, rank: int, hosts: list[list[int]], store, old: Membership | None,
             ) -> Membership:
    host_of = tuple(next(i for i, h in enumerate(hosts) if r in h) for r in range(w["size"]))
    if old is not None:
        return old.grown(tuple(w["pids"][w["members"]:]), host_of)
    return Membership(rank, w["size"], tuple(w["pids"]), store, None, w["generation"],
                      tuple(w["origin"]) + tuple(range(w["members"], w["size"])),
                      w["timeout"], w["peer_timeout"], tuple(w["joined"]), host_of, None,
                      tuple(w["keys"]) + joined_keys(w["generation"], w["members"], w["size"]))


def _install(members: Membership, hosts: list[list[int]], heap, keep: list, block,
             local_world, world) -> _c.Communicator:
    groups = _placeholder(hosts, members.rank)
    mine = hosts[groups.host]
    local_members = Membership(groups.local_index, len(mine),
                               tuple(members.pids[r] for r in mine), None, None,
                               members.generation, timeout=members.timeout,
                               peer_timeout=members.peer_timeout)
    comm = assemble("cpu", torch.device("cpu"), world.local_rank, heap, keep, (None, 0),
                    block, local_members, local_world, members, world, groups)
    _c.install(comm)
    return comm


def _connect(comm: _c.Communicator, prefix: str, point: str) -> None:
    """The default group, then the hosts' groups, over the grown world; filled in."""
    members, local = comm.members, comm.local
    assert members is not None and comm.across is not None
    assert comm._world is not None and local._world is not None
    hosts = comm.across.hosts
    pg, made = connect_group(members, prefix, point, lambda attempt: make_groups(
        "cpu", False, hosts, members.rank, members.timeout, new_group=attempt.new_group))
    group, groups = made
    comm.group = comm.cpu_group = pg
    comm._world = dataclasses.replace(comm._world, group=pg, cpu_group=pg)
    comm.across = groups
    assert isinstance(local.control, ControlBlock)
    comm.control = HostsAgreement(local.control, hosts, groups.host, groups.cross_hosts,
                                  groups.cross_group, members, groups.extra)
    local.group = local.cpu_group = group
    local._world = dataclasses.replace(local._world, group=group, cpu_group=group)


# -- members ------------------------------------------------------------------------------
def grow_across(old: _c.Communicator, n: int, limit: float) -> _c.Communicator:
    """``commlab.grow(n)`` in a world across hosts (checked by ``_grow.grow``)."""
    m, world, here = old.members, old._world, old._local
    assert m is not None and m.store is not None and world is not None and here is not None
    assert old.across is not None and here._world is not None
    control = here.control
    assert isinstance(control, ControlBlock)
    key, joins, store, prefix, arena = begin(old, m, limit)
    heap = old.heap
    probe = _shm.segment_name(world.token, "probe", m.rank)
    nonce = os.urandom(8)
    seg = _shm.create(probe, 8)
    seg[:8] = nonce
    try:
        reach("grow.arrive")
        store.set(f"{prefix}/arrive/{m.rank}", json.dumps(
            {"pid": os.getpid(), "fd": heap.fd, "arena": hashlib.sha1(
                json.dumps(arena).encode()).hexdigest(), "probe": probe,
             "nonce": nonce.hex(), "machine": machine()}))
        if store.compare_set(f"{prefix}/decider", "", str(m.rank)).decode() == str(m.rank):
            _decide(old, m, joins, store, prefix, n, limit, arena, key)
        decision = json.loads(_member_wait(m, store, f"{prefix}/decision", limit + 60))
        if "abort" in decision:
            raise CollectiveTimeoutError(
                f"commlab.grow({n}) on rank {m.rank}: {decision['abort']}; the world "
                f"continues unchanged with its {m.world_size} ranks")
        w = decision["world"]
        pids = tuple(w["pids"])
        rnd = _Round(store, prefix, pids, m.rank, time.monotonic() + w["phase_s"])
        rnd.gone = _gone(rnd, w, m)
        maps: list = []
        hosts = None
        try:
            try:
                hosts = _grown_hosts(rnd, w)
                h = old.across.host
                added = [r for r in hosts[h] if r >= m.world_size]
                maps += [rnd.heap(r, heap.layout.size) for r in added]
                if added:
                    maps.append(_host_block(rnd, w, hosts, h, m.rank))
            except OSError as e:  # a segment gone: its owner died, or the round aborted
                raise rnd.fail(f"cannot map a newcomer's heap or the agreement block ({e})") \
                    from None
            reach("grow.ready")
            rnd.verdict()
        except _Aborted as e:
            _unlink(w, hosts)
            lost = _member_died(m, str(e))
            if lost:
                raise m.error(lost, "commlab.grow", "grow") from None
            raise CommlabError(f"commlab.grow({n}) on rank {m.rank}: {e}; the world "
                               f"continues unchanged with its {m.world_size} ranks") from None
    finally:
        seg.close()
        _shm.unlink(probe)
    assert hosts is not None
    _unlink(w, hosts)
    lay = heap.layout
    heap.region(lay.signal_pad, SIGNAL_PAD_BYTES + FLAGS_BYTES, torch.uint8).zero_()
    members = _members(w, m.rank, hosts, store, m)
    others = [members.beat_key(r) for r in range(m.world_size, w["size"])
              if members.hosts[r] != members.hosts[m.rank]]
    if m.beats is not None:
        m.beats.watch(others)
    mine = hosts[old.across.host]
    block = control
    if maps:  # this host grew: the newcomers' heaps and the host's new block
        heap.bases = heap.bases + [_addr(mp) for mp in maps[:-1]]
        block = ControlBlock(maps[-1], control.rank, len(mine), control.timeout)
    size = w["size"]
    world = dataclasses.replace(world, world_size=size, placement=Placement(("",) * size))
    local_world = dataclasses.replace(here._world, world_size=len(mine),
                                      placement=Placement(("",) * len(mine)))
    for retired in (old, here):
        retired.closed = True  # its heap and mappings live on in the grown one
        retired.plans.clear()
    comm = _install(members, hosts, heap, here._keep + maps, block, local_world, world)
    _connect(comm, prefix, "grow.commit")
    return comm


# -- newcomers ----------------------------------------------------------------------------
def _my_host(w: dict) -> int:
    """The host whose members' probes this process can read, or -1."""
    seen = []
    for r, a in enumerate(w["arrivals"]):
        try:
            seg = _shm.open_existing(a["probe"], 8)
        except OSError:  # another host's /dev/shm
            continue
        if bytes(seg[:8]) == bytes.fromhex(a["nonce"]):
            seen.append(r)
        seg.close()
    hosts = [i for i, h in enumerate(w["hosts"]) if any(r in seen for r in h)]
    if not hosts:
        return -1
    return min(hosts, key=lambda i: (len(w["hosts"][i]), i))


def join_across(store, prefix: str, rank: int, w: dict, timeout: float) -> _c.Communicator:
    """``commlab.init(join=True)``'s part once admitted to a world across hosts."""
    size, pids = w["size"], tuple(w["pids"])
    rnd = _Round(store, prefix, pids, rank, time.monotonic() + w["phase_s"])
    rnd.gone = _gone(rnd, w, None)
    layout = HeapLayout(*w["layout"])
    name = _shm.segment_name(w["token"], "heap", rank)
    mine = fd = hosts = None
    try:
        check_settings(rnd, w)
        store.set(f"{prefix}/host/{rank}", json.dumps({"host": _my_host(w),
                                                       "machine": machine()}))
        hosts = _grown_hosts(rnd, w)
        h = next(i for i, ranks in enumerate(hosts) if rank in ranks)
        mine = _shm.create(name, layout.size)
        fd = _shm.OpenFd(name)
        store.set(f"{prefix}/heap/{rank}", name)
        reach("join.map")
        maps = []
        try:
            maps = map_heaps(rnd, w, hosts[h], rank, mine, layout.size)
            block = _host_block(rnd, w, hosts, h, rank)
        except OSError as e:
            raise rnd.fail(f"cannot map a peer's heap or the agreement block ({e}); "
                           f"newcomers must run as the same user as the members") from None
        rnd.verdict()
    except _Aborted as e:
        _unlink(w, hosts)
        raise CommlabError(f"commlab.init(join=True): the grow admitting this process as "
                           f"rank {rank} failed: {e}; call commlab.init(join=True) again "
                           f"to wait for the next grow") from None
    assert hosts is not None
    _unlink(w, hosts)
    li = hosts[h].index(rank)
    heap = _newcomer_heap(layout, li, [_addr(mp) for mp in maps], mine, w["arena"])
    heap.fd = fd.fd
    members = _members(w, rank, hosts, store, None)
    members.beats = Beats(store, members.beat_key(rank),
                          [members.beat_key(r) for r in range(size)
                           if members.hosts[r] != members.hosts[rank]], members.peer_timeout)
    no_group = cast(dist.ProcessGroup, None)  # set by _connect
    world = _bootstrap.World(rank, size, li, "cpu", torch.device("cpu"), no_group, no_group,
                             w["token"], True, Placement(("",) * size), "shm", store, None)
    local_world = dataclasses.replace(world, rank=li, world_size=len(hosts[h]),
                                      placement=Placement(("",) * len(hosts[h])),
                                      owns_pg=False, store=None)
    from commlab._interpreter import bounds
    from commlab._interpreter import triton_lib as _triton_lib

    _triton_lib.adopt(all_modules=True)  # kernels a script defined before the import
    bounds.set_heap_size(layout.size)
    block_ctl = ControlBlock(block, li, len(hosts[h]), w["timeout"])
    comm = _install(members, hosts, heap, maps + [block, fd], block_ctl, local_world, world)
    PENDING_STATE[0] = True
    _connect(comm, prefix, "join.commit")
    return comm


ACROSS_HOSTS[0] = (grow_across, join_across)
