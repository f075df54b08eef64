"""Which ranks share a host: found by probing shared memory, not by trusting launchers.

Every rank creates a tiny /dev/shm segment holding a random nonce and publishes its name
through the bootstrap group; every rank then tries to open every other rank's segment
and read the nonce back. Ranks that can read each other's segment share memory: they
form one host, and one symmetric heap. Launcher variables (LOCAL_WORLD_SIZE, an MPI
launcher's local rank) are never trusted for this: two containers on one machine, or a
private /dev/shm per job, would make them lie.

``COMMLAB_HOSTS`` may split the probed hosts further (tests run "hosts" on one machine
with it): ``"2"`` puts ranks 0-1, 2-3, ... on hosts of two, ``"0,1;2,3"`` names them. It
can only split: ranks it puts together must really share memory.

A world across hosts starts with the same number of ranks on every host (the
hierarchical collectives pair rank i of one host with rank i of every other). A shrink
can leave hosts of different sizes: then the group of local index i takes rank
``i mod L_h`` of a host of ``L_h`` ranks (``cross_sets``), so a rank of a smaller host
stands in for the ranks its host lacks, in several groups (``HostGroups.extra``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from commlab import _config
from commlab.errors import CommlabUsageError
from commlab.runtime import _shm
from commlab.runtime._bootstrap import World
from commlab.runtime._devices import Placement


@dataclass
class HostGroups:
    """This rank's place in a world across hosts and the torch.distributed groups the
    hierarchical collectives use between hosts."""

    hosts: list[list[int]]  # global ranks per host, hosts ordered by their first rank
    host: int  # this rank's host
    local_index: int  # this rank's index among its host's ranks (its local rank)
    cross_ranks: list[int]  # global ranks with this local index, one per host, ascending
    cross_hosts: list[int]  # the host of each: torch numbers a group's ranks ascending,
    #                         which need not be host order (hosts [[0, 3], [1, 2]])
    cross_group: dist.ProcessGroup  # those ranks (gloo on cpu; gloo + NCCL on cuda)
    # hosts of different sizes (after a shrink): the other groups this rank stands in,
    # as (group, its ranks ascending, the host of each)
    extra: list[tuple[dist.ProcessGroup, list[int], list[int]]] = field(default_factory=list)

    @property
    def even(self) -> bool:
        """Whether every host has as many ranks (the schedules of ``collectives._hier``)."""
        return len({len(h) for h in self.hosts}) == 1


def cross_sets(hosts: list[list[int]]) -> list[list[int]]:
    """The ranks of each local index i, one per host in host order: rank ``i mod L_h`` of
    a host of ``L_h`` ranks (on equal hosts: rank i of every host)."""
    return [[h[i % len(h)] for h in hosts] for i in range(max(len(h) for h in hosts))]


def _exchange(world: World, obj) -> list:
    out = [None] * world.world_size
    dist.all_gather_object(out, obj, group=world.cpu_group)
    return out


def _probe(world: World) -> list[list[int]]:
    """Every rank's list of ranks whose shared memory it can open (itself included)."""
    name = _shm.segment_name(world.token, "probe", world.rank)
    nonce = os.urandom(8)
    mine = _shm.create(name, 8)
    try:
        mine[:8] = nonce
        peers = _exchange(world, (name, nonce))
        seen = []
        for r, (peer_name, peer_nonce) in enumerate(peers):
            if r == world.rank:
                seen.append(r)
                continue
            try:
                m = _shm.open_existing(peer_name, 8)
            except OSError:  # another host's /dev/shm: no such segment here
                continue
            if bytes(m[:8]) == peer_nonce:  # a same-named segment of another world reads wrong
                seen.append(r)
            m.close()
        return _exchange(world, seen)  # also: every rank has finished opening ours
    finally:
        mine.close()
        _shm.unlink(name)


def _classes(seen: list[list[int]]) -> list[list[int]]:
    hosts: list[list[int]] = []
    for r, s in enumerate(seen):
        if s and r == min(s):  # the host's first rank names it
            hosts.append(sorted(s))
    placed = sorted(r for h in hosts for r in h)
    if placed != list(range(len(seen))) or any(sorted(seen[r]) != h for h in hosts for r in h):
        shown = "; ".join(f"rank {r} opens {s}" for r, s in enumerate(seen))
        raise CommlabUsageError(
            f"commlab.init: the ranks' shared memory is not one clean partition ({shown}); "
            f"every rank of a host must see every other's /dev/shm: give the ranks of one "
            f"host one /dev/shm (one container or mount namespace per host)")
    return hosts


def _forced(text: str, world_size: int) -> list[list[int]]:
    text = text.strip()
    if text.isdigit():
        per = int(text)
        if per <= 0 or world_size % per:
            raise CommlabUsageError(
                f"COMMLAB_HOSTS={text!r}: ranks per host must divide the world size "
                f"({world_size}); pass a divisor, or name the hosts (e.g. '0,1;2,3')")
        return [list(range(s, s + per)) for s in range(0, world_size, per)]
    try:
        hosts = [sorted(int(r) for r in part.split(",")) for part in text.split(";")]
    except ValueError:
        hosts = []
    if sorted(r for h in hosts for r in h) != list(range(world_size)):
        raise CommlabUsageError(
            f"COMMLAB_HOSTS={text!r}: not a partition of ranks 0..{world_size - 1}; write "
            f"ranks per host ('2') or every rank once, hosts split by ';' ('0,1;2,3')")
    return sorted(hosts)


def host_map(world: World) -> list[list[int]]:
    """The world's hosts (lists of global ranks, ascending, hosts by first rank); the
    same on every rank. Collective."""
    if world.world_size == 1:
        return [[0]]
    hosts = _classes(_probe(world))
    forced = _config.get("COMMLAB_HOSTS")
    if forced:
        wanted = _forced(forced, world.world_size)
        host_of = {r: i for i, h in enumerate(hosts) for r in h}
        apart = [h for h in wanted if len({host_of[r] for r in h}) > 1]
        if apart:
            raise CommlabUsageError(
                f"COMMLAB_HOSTS={forced!r} puts ranks {apart[0]} on one host, but they "
                f"share no memory (probed hosts: {hosts}); it can only split hosts")
        hosts = wanted
    sizes = {len(h) for h in hosts}
    if len(sizes) > 1:
        raise CommlabUsageError(
            f"commlab.init: a world across hosts needs the same number of ranks on every "
            f"host, got {[len(h) for h in hosts]} (hosts {hosts}); start as many ranks on "
            f"each host (torchrun --nproc-per-node)")
    return hosts


def split(world: World, hosts: list[list[int]], timeout_s: float) -> tuple[World, HostGroups]:
    """This host's world (local ranks, its own groups and segment names) and the groups
    between hosts, which give up after ``timeout_s`` (at least 30 s) like the world's.
    Collective: every rank makes every group, in the same order."""
    group, groups = make_groups(world.backend, world.placement.shared, hosts, world.rank,
                                timeout_s)
    host, local_index = groups.host, groups.local_index
    local = World(local_index, len(hosts[host]), world.local_rank, world.backend,
                  world.device, group, group, f"{world.token}{host:02x}", False,
                  Placement(tuple(world.placement.gpus[r] for r in hosts[host]))
                  if world.placement.gpus else world.placement, world.heap)
    return local, groups


def make_groups(backend: str, shared: bool, hosts: list[list[int]], rank: int,
                timeout_s: float, new_group: Callable[..., dist.ProcessGroup] = dist.new_group,
                ) -> tuple[dist.ProcessGroup, HostGroups]:
    """This host's group and the groups between hosts, over torch.distributed's default
    group (``rank``: ours in it). Collective: every rank makes every group, in the same
    order (one per host, then one per local index); ``new_group``: how (a connect's
    ``_watched_groups.Attempt.new_group`` builds them in its thread, registered later)."""
    pg = "gloo" if backend == "cpu" or shared else "cpu:gloo,cuda:nccl"  # NCCL: no shared GPU
    limit = timedelta(seconds=max(timeout_s, 30))
    host = next(i for i, h in enumerate(hosts) if rank in h)
    local_index = hosts[host].index(rank)
    local_groups = [new_group(h, backend=pg, timeout=limit) for h in hosts]
    cross = cross_sets(hosts)
    cross_groups = [new_group(sorted(c), backend=pg, timeout=limit) for c in cross]
    host_of = {r: i for i, h in enumerate(hosts) for r in h}

    def placed(i: int) -> tuple[dist.ProcessGroup, list[int], list[int]]:
        ranks = sorted(cross[i])
        return cross_groups[i], ranks, [host_of[r] for r in ranks]

    mine = placed(local_index)
    extra = [placed(i) for i in range(len(cross)) if i != local_index and rank in cross[i]]
    return local_groups[host], HostGroups(hosts, host, local_index, mine[1], mine[2],
                                          mine[0], extra)
