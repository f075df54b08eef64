"""The public collectives in a world across hosts: commlab's kernels inside each host
(on ``comm.local``), torch.distributed between hosts (gloo on CPU, NCCL on GPU), on
the groups of ranks with the same local index, one per host (``comm.across``).

With H hosts of L ranks, rank (h, i) is the i-th rank of host h. Every op moves each
byte between hosts once (the inter-host links are the slow ones):

    all_reduce  <= 1 MiB or a named algorithm: all_reduce inside (that algorithm), then
                all_reduce between hosts (every local index at once, on the whole);
                auto above: reduce_scatter inside, all_reduce of the 1/L shard
                between hosts, all_gather inside
    all_gather  all_gather between hosts, then inside, then rows in rank order
    reduce_scatter  inside on chunks grouped by local index, then between hosts
    all_to_all  inside (chunks grouped by destination local index), then between hosts
    broadcast   between hosts on the source's local index, then inside from it
    barrier     the world's agreement (already a barrier), then the host's barrier

Hosts of different sizes (a shrink's) take the schedules of ``_hier_uneven`` after the
agreement.

Arguments are checked on every rank and agreed across the world first (the host's
agreement block, then one exchange between hosts: ``runtime._cross``), so an error is
raised on every rank before anything moves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import commlab.collectives._across as _across
from commlab.collectives import _hier_uneven as _uneven
from commlab.collectives._common import agree, check_local
from commlab.collectives._host import Collective
from commlab.collectives.all_gather import ALL_GATHER, all_gather
from commlab.collectives.all_reduce import ALL_REDUCE, all_reduce
from commlab.collectives.all_to_all import ALL_TO_ALL, all_to_all
from commlab.collectives.barrier import barrier
from commlab.collectives.broadcast import BROADCAST, broadcast
from commlab.collectives.reduce_scatter import REDUCE_SCATTER, reduce_scatter
from commlab.runtime import HostGroups
from commlab.runtime.communicator import Communicator, get_communicator, using

TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
SPLIT_BYTES = 1 << 20  # auto: above this, all_reduce reduce-scatters inside first


def groups(comm: Communicator) -> HostGroups:
    """The groups between hosts of a world across hosts."""
    assert comm.across is not None, "only a world across hosts takes the hierarchical path"
    return comm.across


def by_local_index(comm: Communicator) -> list[int]:
    """Global ranks ordered (local index, host): position j*H + h holds rank (h, j)."""
    hosts = comm.hosts
    return [h[j] for j in range(len(hosts[0])) for h in hosts]


def by_host(comm: Communicator) -> list[int]:
    """Global ranks ordered (host, local index): position h*L + j holds rank (h, j)."""
    return [r for h in comm.hosts for r in h]


def agreed(coll: Collective, comm: Communicator, x, algorithm: str, **fields) -> torch.Tensor:
    """Check this rank's call and agree on it with the whole world (same error everywhere)."""
    err = check_local(comm, x, algorithm, coll.algorithms, fields, coll.shape_rule)
    return agree(coll.name, x, err, **fields, algorithm=algorithm).x.contiguous()


def host_order(comm: Communicator, got: torch.Tensor) -> torch.Tensor:
    """``got`` [H, ...] in the order of our group between hosts -> in host order."""
    out = torch.empty_like(got)
    out[groups(comm).cross_hosts] = got
    return out


def group_order(comm: Communicator, t: torch.Tensor) -> torch.Tensor:
    """``t`` [H, ...] in host order -> in the order of our group between hosts (torch
    numbers a group's ranks ascending, which need not be host order)."""
    return t[groups(comm).cross_hosts]


def between(comm: Communicator, op: str, work) -> None:
    """Wait for the part between hosts; on CPU while looking at the world's members, so
    a host gone raises RankLostError within COMMLAB_PEER_TIMEOUT instead of gloo's
    timeout."""
    if comm.members is None or comm.backend != "cpu":
        work.wait()
        return
    comm.members.wait(work, f"{op} #{comm.control.seq} (between hosts)")


def _rows(x: torch.Tensor, world: int) -> torch.Tensor:
    return x.reshape(world, -1)


def _all_reduce(comm: Communicator, x, algorithm: str = "auto", op: str = "sum"):
    x = agreed(ALL_REDUCE, comm, x, algorithm, op=op)
    if x.numel() == 0:
        return torch.empty_like(x)
    if not groups(comm).even:
        return _uneven.all_reduce(comm, x, algorithm, op)
    group = groups(comm).cross_group
    local = comm.local
    if algorithm == "auto" and x.numel() * x.element_size() > SPLIT_BYTES:
        n, L = x.numel(), local.world_size
        flat = torch.cat([x.reshape(-1), x.new_zeros((-n) % L)])  # pad: L equal shards
        with using(local):
            shard = reduce_scatter(flat, op=op)
        between(comm, "all_reduce", dist.all_reduce(shard, op=TORCH_OPS[op], group=group,
                                                    async_op=True))
        with using(local):
            return all_gather(shard)[:n].view(x.shape)
    with using(local):
        y = all_reduce(x, op=op, algorithm=algorithm)
    between(comm, "all_reduce", dist.all_reduce(y, op=TORCH_OPS[op], group=group,
                                                async_op=True))
    return y


def _all_gather(comm: Communicator, x, algorithm: str = "auto"):
    x = agreed(ALL_GATHER, comm, x, algorithm)
    W, H = comm.world_size, len(comm.hosts)
    out = x.new_empty((W * x.shape[0], *x.shape[1:]))
    if x.numel() == 0:
        return out
    if not groups(comm).even:
        return _uneven.all_gather(comm, x, algorithm)
    parts = [torch.empty_like(x) for _ in range(H)]
    between(comm, "all_gather", dist.all_gather(parts, x, group=groups(comm).cross_group,
                                                async_op=True))
    mine = host_order(comm, torch.stack(parts))  # [h]: rank (h, i)'s x
    with using(comm.local):
        got = all_gather(mine, algorithm=algorithm)  # [(j, h)]: rank (h, j)'s x
    out.view(W, *x.shape)[by_local_index(comm)] = got.view(W, *x.shape)
    return out


def _reduce_scatter(comm: Communicator, x, algorithm: str = "auto", op: str = "sum"):
    x = agreed(REDUCE_SCATTER, comm, x, algorithm, op=op)
    W = comm.world_size
    shape = (x.shape[0] // W, *x.shape[1:])
    if x.numel() == 0:
        return x.new_empty(shape)
    if not groups(comm).even:
        return _uneven.reduce_scatter(comm, x, op)
    grouped = _rows(x, W)[by_local_index(comm)]  # chunks for local index j together
    with using(comm.local):
        mine = reduce_scatter(grouped, op=op)  # [H, m]: the host's sums of our chunks
    out = x.new_empty(shape)
    reduce_scatter_between(comm, "reduce_scatter", out, group_order(comm, mine), op)
    return out


def reduce_scatter_between(comm: Communicator, name: str, out: torch.Tensor,
                           send: torch.Tensor, op: str = "sum") -> None:
    """``out`` = the ``op`` over hosts of chunk j of every group member's ``send`` [H, m]
    (j: our place in the group). An all_to_all then a local reduction moves the bytes
    a reduce_scatter moves; gloo's reduce_scatter work completes only inside its
    ``wait()``, which cannot be watched for a lost host."""
    recv = torch.empty_like(send)
    between(comm, name, dist.all_to_all_single(recv.view(-1), send.reshape(-1),
                                               group=groups(comm).cross_group, async_op=True))
    got = recv.view(send.shape[0], -1)
    red = {"sum": got.sum(0), "max": got.amax(0), "min": got.amin(0)}[op]
    out.view(-1).copy_(red)


def _all_to_all(comm: Communicator, x, algorithm: str = "auto"):
    x = agreed(ALL_TO_ALL, comm, x, algorithm)
    if x.numel() == 0:
        return torch.empty_like(x)
    if not groups(comm).even:
        return _uneven.all_to_all(comm, x)
    W, H, L = comm.world_size, len(comm.hosts), comm.local.world_size
    grouped = _rows(x, W)[by_local_index(comm)]  # [L * H, m]: by destination (j, h)
    with using(comm.local):
        got = all_to_all(grouped, algorithm=algorithm)  # [L(k), H(h'), m]: (h,k) -> (h',i)
    send = group_order(comm, got.view(L, H, -1).transpose(0, 1))  # [H(h'), L(k), m]
    recv = torch.empty_like(send)
    between(comm, "all_to_all", dist.all_to_all_single(
        recv.view(-1), send.view(-1), group=groups(comm).cross_group, async_op=True))
    out = torch.empty_like(x)
    _rows(out, W)[by_host(comm)] = host_order(comm, recv).view(W, -1)  # (h'', k) -> us
    return out


def _broadcast(comm: Communicator, x, algorithm: str = "auto", src: int = 0):
    x = agreed(BROADCAST, comm, x, algorithm, src=src)
    if x.numel() == 0:
        return torch.empty_like(x)
    if not groups(comm).even:
        return _uneven.broadcast(comm, x, algorithm, src)
    host = next(h for h in comm.hosts if src in h)
    src_index = host.index(src)
    y = x.clone()
    if groups(comm).local_index == src_index:  # our group holds the source
        between(comm, "broadcast", dist.broadcast(y, src=src, group=groups(comm).cross_group,
                                                  async_op=True))
    with using(comm.local):
        return broadcast(y, src=src_index, algorithm=algorithm)


def _barrier(comm: Communicator) -> None:
    comm.synchronize()  # device work before the barrier is done on every host
    agree("barrier", None, "")  # every rank of every host has arrived
    with using(comm.local):
        barrier()


def _entry(fn):
    def run(*args):
        return fn(get_communicator(), *args)
    return run


for _name, _fn in (("all_reduce", _all_reduce), ("all_gather", _all_gather),
                   ("reduce_scatter", _reduce_scatter), ("all_to_all", _all_to_all),
                   ("broadcast", _broadcast), ("barrier", _barrier)):
    _across.install(_name, _entry(_fn))
