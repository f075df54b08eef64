"""The public collectives across hosts of different sizes, the world a shrink leaves when
a rank of one host died and the survivors still span several hosts.

The group of local index i holds rank ``i mod L_h`` of each host of ``L_h`` ranks
(``runtime._hosts.cross_sets``), so every group has one rank per host and a rank of a
smaller host is in several groups. Each op runs inside every host (commlab's kernels on
``comm.local``), then between hosts in *every* group a rank is in; a rank keeps what its
own group (its local index's) returned:

    all_reduce      all_reduce inside, all_reduce between hosts
    all_gather      all_gather inside (the host's rows), all_gather of the host blocks,
                    padded to the largest host, between hosts; rows in rank order
    broadcast       broadcast inside the source's host, broadcast between hosts from that
                    host's rank of each group
    reduce_scatter  all_reduce, then this rank's chunk (W times the bytes of the even
                    schedule between hosts)
    all_to_all      all_gather, then this rank's chunk of every rank (W times the bytes)

Arguments arrive agreed by the whole world (``collectives._hier``). These schedules
trade bandwidth for one simple rule; a world meant to run long on uneven hosts is better
restarted with equal hosts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from commlab.collectives.all_gather import all_gather as _local_all_gather
from commlab.collectives.all_reduce import all_reduce as _local_all_reduce
from commlab.collectives.broadcast import broadcast as _local_broadcast
from commlab.runtime.communicator import Communicator, using

_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _groups(comm: Communicator) -> list[tuple[dist.ProcessGroup, list[int], list[int]]]:
    """(group, ranks ascending, host of each) of every group this rank is in, its own
    local index's first."""
    g = comm.across
    assert g is not None
    return [(g.cross_group, g.cross_ranks, g.cross_hosts), *g.extra]


def _wait(comm: Communicator, op: str, works: list) -> None:
    """Wait for the parts between hosts while looking at the world's members (a lost one
    raises RankLostError within COMMLAB_PEER_TIMEOUT)."""
    if comm.members is None or comm.backend != "cpu":
        for w in works:
            w.wait()
        return
    comm.members.wait_all(works, f"{op} #{comm.control.seq} (between hosts)")


def all_reduce(comm: Communicator, x: torch.Tensor, algorithm: str, op: str) -> torch.Tensor:
    with using(comm.local):
        y = _local_all_reduce(x, op=op, algorithm=algorithm)  # the host's reduction
    outs = [y] + [y.clone() for _ in _groups(comm)[1:]]
    _wait(comm, "all_reduce", [dist.all_reduce(o, op=_TORCH_OPS[op], group=g, async_op=True)
                               for o, (g, _, _) in zip(outs, _groups(comm), strict=True)])
    return y


def all_gather(comm: Communicator, x: torch.Tensor, algorithm: str) -> torch.Tensor:
    W, n, rest = comm.world_size, x.shape[0], x.shape[1:]
    L = max(len(h) for h in comm.hosts)
    out = x.new_empty((W * n, *rest))
    with using(comm.local):
        mine = _local_all_gather(x, algorithm=algorithm)  # [L_h * n, ...]: the host's rows
    block = x.new_zeros((L * n, *rest))  # every host's block as large as the largest
    block[: mine.shape[0]] = mine
    parts = [[torch.empty_like(block) for _ in ranks] for _, ranks, _ in _groups(comm)]
    _wait(comm, "all_gather", [dist.all_gather(p, block, group=g, async_op=True)
                               for p, (g, _, _) in zip(parts, _groups(comm), strict=True)])
    rows = out.view(W, n, *rest)
    for part, h in zip(parts[0], comm.across.cross_hosts, strict=True):  # type: ignore[union-attr]
        ranks = comm.hosts[h]
        rows[ranks] = part[: len(ranks) * n].view(len(ranks), n, *rest)
    return out


def broadcast(comm: Communicator, x: torch.Tensor, algorithm: str, src: int) -> torch.Tensor:
    hosts = comm.hosts
    src_host = next(h for h, ranks in enumerate(hosts) if src in ranks)
    y = x.clone()
    if comm.rank in hosts[src_host]:  # every rank of the source's host holds it now
        with using(comm.local):
            y = _local_broadcast(x, src=hosts[src_host].index(src), algorithm=algorithm)
    outs = [y] + [y.clone() for _ in _groups(comm)[1:]]
    _wait(comm, "broadcast", [
        dist.broadcast(o, src=ranks[where.index(src_host)], group=g, async_op=True)
        for o, (g, ranks, where) in zip(outs, _groups(comm), strict=True)])
    return y


def reduce_scatter(comm: Communicator, x: torch.Tensor, op: str) -> torch.Tensor:
    W = comm.world_size
    y = all_reduce(comm, x, "auto", op)
    return y.view(W, -1)[comm.rank].reshape(x.shape[0] // W, *x.shape[1:]).clone()


def all_to_all(comm: Communicator, x: torch.Tensor) -> torch.Tensor:
    W = comm.world_size
    every = all_gather(comm, x, "auto").view(W, W, -1)  # [source, destination, chunk]
    return every[:, comm.rank].reshape(x.shape).clone()
