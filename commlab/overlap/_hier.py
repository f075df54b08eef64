"""ag_gemm and gemm_rs in a world across hosts: the overlapped kernels inside each host
(on ``comm.local``, with the algorithm asked for), torch.distributed between hosts.

    ag_gemm:  all_gather a between hosts (rank i of every host: H shards), then for each
              host's shard set an ag_gemm inside the host -> that host's rows of the output
    gemm_rs:  rows regrouped by destination local index, gemm_rs inside the host (the
              host's sum of the rows of the ranks with our local index, every host's),
              then reduce_scatter between hosts -> our rows

Row permutations commute with the GEMM, so both are exact rearrangements of the flat op.
On hosts of different sizes (a shrink's) both are the GEMM and the collective one after
the other (``collectives._hier_uneven``): no overlap.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import commlab.collectives._across as _across
from commlab.collectives import _hier_uneven as _uneven
from commlab.collectives._hier import (
    between,
    by_local_index,
    group_order,
    groups,
    host_order,
    reduce_scatter_between,
)
from commlab.overlap import _args
from commlab.overlap.ag_gemm import ag_gemm
from commlab.overlap.gemm_rs import gemm_rs
from commlab.runtime.communicator import get_communicator, using


def _ag_gemm(a, b, algorithm: str = "auto") -> torch.Tensor:
    comm = get_communicator()
    _args.agree_args("ag_gemm", comm, a, b, algorithm, rows_divisible=False)
    W, H, rows = comm.world_size, len(comm.hosts), a.shape[0]
    a = a.contiguous()
    if not groups(comm).even:
        return _uneven.all_gather(comm, a, "auto") @ b
    parts = [torch.empty_like(a) for _ in range(H)]
    between(comm, "ag_gemm", dist.all_gather(parts, a, group=groups(comm).cross_group,
                                             async_op=True))
    shards = host_order(comm, torch.stack(parts))  # [h]: rank (h, i)'s a
    out = a.new_empty((W, rows, b.shape[1]))
    for h, ranks in enumerate(comm.hosts):
        with using(comm.local):
            out[ranks] = ag_gemm(shards[h], b, algorithm=algorithm).view(len(ranks), rows, -1)
    return out.view(W * rows, -1)


def _gemm_rs(a, b, algorithm: str = "auto") -> torch.Tensor:
    comm = get_communicator()
    _args.agree_args("gemm_rs", comm, a, b, algorithm, rows_divisible=True)
    W = comm.world_size
    if not groups(comm).even:
        return _uneven.reduce_scatter(comm, (a @ b).contiguous(), "sum")
    chunk = a.shape[0] // W
    grouped = a.reshape(W, -1)[by_local_index(comm)].view(a.shape)
    with using(comm.local):
        mine = gemm_rs(grouped, b, algorithm=algorithm)  # [H * chunk, N]
    out = mine.new_empty((chunk, b.shape[1]))
    per_host = group_order(comm, mine.view(len(comm.hosts), chunk, -1))  # [H, chunk, N]
    reduce_scatter_between(comm, "gemm_rs", out, per_host.reshape(len(comm.hosts), -1))
    return out


_across.install("ag_gemm", _ag_gemm)
_across.install("gemm_rs", _gemm_rs)
