"""``commlab.shrink()``: the survivors of a lost rank continue as a smaller world, in place.

Every survivor calls it after its ``RankLostError``. ``membership.agree`` decides the
survivors (the same set everywhere); before confirming, each survivor zeroes what it owns
in the new world (its signal pad and collective flags; new rank 0 also the agreement
block), so once every survivor confirmed, nobody's stale flag or published call is left
(every survivor's kernels had ended before it arrived: an interpreted launch raises only
after all its programs stopped; on a GPU shrink sets the abort word, waits for the
device, and clears the word once the pad is zeroed). Then, without another exchange:

- the heap stays as it is (every mapping, the arena, every symmetric tensor with its
  contents and offset); its ``rank`` and ``bases`` become the survivors' (old order);
- a new agreement block over the same shared memory, numbered 0..W'-1;
- a new ``context`` for kernels, no cached launch plans;
- torch.distributed's default group, which cannot outlive a member, is destroyed and made
  again over the survivors under a fresh store prefix (the round's: never used before):
  commlab's own gloo group, or, where torch.distributed runs on the "commlab" backend,
  that backend's group (``set_torch_regroup``; its old groups are retired).

Across hosts each host does the same with its own heap and block (its first survivor
zeroes the block); survivors of one host continue as that host's world, survivors on
several hosts as a world across those hosts (``_shrink_hosts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from commlab.errors import CommlabUsageError, RankLostError
from commlab.runtime import _shrink_hosts, _watched_groups, wait_records
from commlab.runtime import communicator as _c
from commlab.runtime._control import ControlBlock
from commlab.runtime.heap import FLAGS_BYTES, SIGNAL_PAD_BYTES
from commlab.runtime.membership import ABANDONED, Membership, agree

# The "commlab" torch.distributed backend (a higher layer) registers how its default group
# is made again over the survivors: ``owns()`` says whether the default group is its own;
# ``regroup(size)`` retires its old groups (main thread) and returns ``connect(attempt)``,
# run in the watched thread, which builds the new default group and the Communicator's
# (group, cpu_group) through the ``_watched_groups.Attempt`` (registered once it connected).
_TORCH_REGROUP: list = [None]


def set_torch_regroup(owns: Callable[[], bool], regroup: Callable) -> None:
    """Register the torch backend's regroup (see ``_TORCH_REGROUP``)."""
    _TORCH_REGROUP[0] = (owns, regroup)


def shrink() -> _c.Communicator:
    """Continue with the survivors after a ``RankLostError``; returns the new default
    Communicator (also ``commlab.get_communicator()``). Collective over the survivors.
    In a world across hosts, survivors of one host (a host cut off or gone) continue as
    that host's world; survivors on several hosts as a world across them."""
    old = _c.get_communicator()
    members = old.members
    # across hosts the heap and the agreement block are this host's (``comm.local``)
    here = old if old._local is None else old._local
    control = here.control
    if not isinstance(control, ControlBlock) or members is None:
        raise CommlabUsageError("commlab.shrink: this world has no membership to shrink "
                                "(a world across hosts needs a store that outlives ranks)")
    world = old._world
    assert world is not None
    torch_backend = (_TORCH_REGROUP[0] is not None and dist.is_initialized()
                     and _TORCH_REGROUP[0][0]())
    # commlab's own gloo group (or none now: a grow or shrink destroyed it and then met
    # a lost rank while connecting the next)
    own_gloo = world.owns_pg and (not dist.is_initialized()
                                  or str(dist.get_backend()) == "gloo")
    if not torch_backend and not own_gloo:
        raise CommlabUsageError(
            f"commlab.shrink: torch.distributed's default group runs on "
            f"{dist.get_backend() if dist.is_initialized() else 'nothing'!r} and was not "
            f"made by commlab, so shrink cannot make it again over the survivors; start "
            f"torch.distributed on the 'commlab' backend (dist.init_process_group('commlab')) "
            f"or let commlab.init start it")
    if old.across is not None and (old.backend != "cpu" or world.store_rank is not None):
        raise CommlabUsageError(
            "commlab.shrink: a world across hosts shrinks only on cpu with a store the "
            "launcher serves (python -m commlab.run, TORCHELASTIC_USE_AGENT_STORE=true)")
    heap = here.heap
    lay = heap.layout
    # GPU: every kernel of this rank gives up its spin and ends before it arrives
    wait_records.abort(here.wait_records)
    here._device_sync()
    if here.abort_watch is not None:
        here.abort_watch.stop()

    def prepare(decision: list[int]) -> None:
        assert members is not None  # checked above; rebound to each round's members
        heap.region(lay.signal_pad, SIGNAL_PAD_BYTES + FLAGS_BYTES, torch.uint8).zero_()
        here._device_sync()
        wait_records.clear_abort(here.wait_records)  # our kernels have ended
        if _shrink_hosts.first_of_host(members, decision):  # the new (local) rank 0
            control.buf[: len(control.buf)] = bytes(len(control.buf))

    # each member's heap base by its rank (across hosts: this host's members only)
    if old.across is None:
        bases = list(heap.bases)
    else:
        mine = old.across.hosts[old.across.host]
        bases = [heap.bases[mine.index(r)] if r in mine else 0 for r in range(old.world_size)]
        ABANDONED.append(old.across)  # its groups may hold a pending receive: never freed
    kept = list(range(old.world_size))  # the survivors' ranks in ``old``
    while True:  # again when a member that confirmed dies before the group connects
        keep, prefix = agree(members, prepare)
        new = members.shrunk(keep)
        bases = [bases[r] for r in keep]
        kept = [kept[r] for r in keep]
        spans = bool(new.hosts) and _shrink_hosts.spans_hosts(new)
        then = _shrink_hosts.groups_maker(old.backend, new, control.timeout) if spans else None
        try:
            group, cpu_group, made = _regroup(world, prefix, new, control.timeout,
                                              torch_backend, then)
            break
        except RankLostError:
            members = new
    if spans:
        world = dataclasses.replace(world, rank=new.rank, world_size=new.world_size,
                                    group=group, cpu_group=cpu_group,
                                    store_rank=new.store_rank)
        comm = _shrink_hosts.across_world(old, here, new, kept, bases, world, made)
        for retired in (old, here):
            retired.closed = True  # its heap and mappings live on in ``comm``
            retired.plans.clear()
        _c.install(comm)
        return comm
    rank, size = new.rank, new.world_size
    heap.rank, heap.bases = rank, bases
    block = ControlBlock(control.buf, rank, size, control.timeout)
    block.members = new
    records_addr = int(here._context[-1])
    ctx = torch.tensor([rank, size, heap.bases[rank] + lay.signal_pad,
                        heap.bases[rank] + lay.flags] + heap.bases + [records_addr],
                       dtype=torch.int64, device=old.device)
    world = dataclasses.replace(world, rank=rank, world_size=size, group=group,
                                cpu_group=cpu_group, store_rank=new.store_rank)
    comm = _c.Communicator(rank, size, old.backend, old.device, ctx, heap, block, group,
                           cpu_group, old.local_rank, world, here._keep,
                           wait_records=here.wait_records, members=new)
    for retired in {id(old): old, id(here): here}.values():
        retired.closed = True  # its heap and mappings live on in ``comm``
        retired.plans.clear()
    _c.watch_kernels(comm)
    _c.install(comm)
    return comm


def _regroup(world, prefix: str, new: Membership, timeout: float, torch_backend: bool,
             then: Callable | None = None) -> tuple[dist.ProcessGroup, dist.ProcessGroup, Any]:
    """torch.distributed's default group again, over the survivors only (commlab's gloo
    group, or the torch backend's: ``torch_backend``); returns the Communicator's group
    and cpu_group, and what ``then(attempt)`` returned (run in the same thread once the
    default group is built: the groups of a world across hosts), or None. Connecting
    blocks in gloo until every member joined, so it runs in a thread this one watches
    (``_watched_groups.connect``): a member lost meanwhile raises RankLostError, and so
    does an error gloo raises for a member that died (``Membership.behind``); the thread
    only builds groups, registered here if the attempt succeeds, so a connect given up
    never touches the next one's."""
    assert world.store is not None  # agree() needed it
    # a connection of its own: an abandoned connect blocks in a store wait until gloo's
    # timeout, and on a shared client it would hold up every later shrink's store calls
    store = dist.PrefixStore(f"{prefix}/pg", world.store.clone())
    limit = timedelta(seconds=max(timeout, 30))
    if torch_backend:
        make = _TORCH_REGROUP[0][1](new.world_size)

    def build(attempt: _watched_groups.Attempt) -> tuple:
        if torch_backend:
            pg = make(attempt)
        else:
            pg = (attempt.default("gloo"),) * 2
        return (*pg, then(attempt) if then is not None else None)

    return _watched_groups.connect(new, store, limit, build, "shrink.regroup",
                                   "commlab.shrink (connecting the survivors' group)",
                                   "shrink", "commlab-regroup")
