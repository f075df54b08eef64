"""The world ``commlab.shrink()`` makes when the survivors still span several hosts.

Each host keeps its heap (every symmetric tensor with its contents and offset: the whole
world agreed every allocation, so offsets stay symmetric) and its agreement block; its
surviving ranks are renumbered 0..L_h'-1 in their old order, and its first survivor
zeroed the block before confirming (``_shrink``). torch.distributed's groups are made
again over the survivors, in the thread ``_shrink._regroup`` watches: one group per
host, one per local index (``_hosts.make_groups``: on hosts of different sizes a rank of
a smaller host stands in for the indices its host lacks). The hierarchical collectives
then run as after ``init``; on hosts of different sizes through ``collectives._hier_uneven``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from commlab._interpreter import liveness
from commlab.runtime import communicator as _c
from commlab.runtime._control import ControlBlock
from commlab.runtime._cross import HostsAgreement
from commlab.runtime._hosts import HostGroups, make_groups
from commlab.runtime._watch import peer_watch
from commlab.runtime.membership import Membership


def host_lists(m: Membership) -> list[list[int]]:
    """The members of each host (ranks ascending, hosts by their first rank)."""
    order = list(dict.fromkeys(m.hosts))
    return [[r for r in range(m.world_size) if m.hosts[r] == h] for h in order]


def spans_hosts(m: Membership) -> bool:
    return len(set(m.hosts)) > 1


def first_of_host(m: Membership, decision: list[int]) -> bool:
    """Whether this member is the first of ``decision`` on its host (it zeroes the
    host's agreement block: the new world's local rank 0)."""
    mine = m.hosts[m.rank] if m.hosts else None
    return next(r for r in decision if not m.hosts or m.hosts[r] == mine) == m.rank


def groups_maker(backend: str, new: Membership, timeout: float):
    """The call ``_regroup`` runs once the survivors' default group is built."""
    hosts = host_lists(new)
    return lambda attempt: make_groups(backend, False, hosts, new.rank, timeout,
                                       new_group=attempt.new_group)


def across_world(old: _c.Communicator, here: _c.Communicator, new: Membership,
                 kept: list[int], bases: list[int], world, made: tuple) -> _c.Communicator:
    """The survivors' world across hosts. ``kept``: the survivors' ranks at ``old``;
    ``bases``: each survivor's heap base, by new rank (0 for other hosts' ranks);
    ``world``: the survivors' bootstrap World; ``made``: this host's group and the
    ``HostGroups`` that ``groups_maker`` returned."""
    local_group: dist.ProcessGroup = made[0]
    groups: HostGroups = made[1]
    control = here.control
    assert isinstance(control, ControlBlock) and here.members is not None
    assert old.across is not None and here._world is not None
    mine = groups.hosts[groups.host]
    li, size = groups.local_index, len(mine)
    heap = here.heap
    heap.rank, heap.bases = li, [bases[r] for r in mine]
    block = ControlBlock(control.buf, li, size, control.timeout)
    old_mine = old.across.hosts[old.across.host]
    local_members = here.members.shrunk([old_mine.index(r) for r in kept if r in old_mine])
    local_world = dataclasses.replace(here._world, rank=li, world_size=size,
                                      group=local_group, cpu_group=local_group)
    return assemble(old.backend, old.device, old.local_rank, heap, here._keep,
                    (here.wait_records, int(here._context[-1])), block, local_members,
                    local_world, new, world, groups)


def assemble(backend: str, device: torch.device, local_rank: int, heap, keep: list,
             records: tuple, block: ControlBlock, local_members: Membership, local_world,
             new: Membership, world, groups: HostGroups) -> _c.Communicator:
    """A world across hosts from this host's parts: its heap (``rank`` and ``bases``
    already this host's new ones), the mappings to keep, its wait records (tensor or
    None, address), its agreement ``block``; ``new``: the world's members; ``groups``:
    its groups (``local_world.group``: this host's)."""
    lay = heap.layout
    li, size = local_members.rank, local_members.world_size
    block.members = new  # every wait on this host looks at the whole world
    ctx = torch.tensor([li, size, heap.bases[li] + lay.signal_pad, heap.bases[li] + lay.flags]
                       + heap.bases + [records[1]], dtype=torch.int64, device=device)
    local = _c.Communicator(li, size, backend, device, ctx, heap, block, local_world.group,
                            local_world.cpu_group, local_rank, local_world, keep,
                            wait_records=records[0], members=local_members)
    agreement = HostsAgreement(block, groups.hosts, groups.host, groups.cross_hosts,
                               groups.cross_group, new, groups.extra)
    liveness.set_watch(peer_watch(new, block.timeout,
                                  lambda: (block._inside[1] or "", block.seq)))
    return _c.Communicator(new.rank, new.world_size, backend, device, ctx, heap, agreement,
                           world.group, world.cpu_group, local_rank, world, [], _local=local,
                           across=groups, members=new)
