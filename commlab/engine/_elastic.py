"""The notebook's world when ranks leave and join (issue 27), for the local launcher.

The notebook serves the world's store (``NotebookStore``; ranks are its clients through
``TORCHELASTIC_USE_AGENT_STORE=true``), so any rank, rank 0 included, may die. A rank that
dies during a cell: the others raise ``RankLostError`` inside their collectives within
``COMMLAB_PEER_TIMEOUT`` and their cells end; ``continue_without`` then runs
``commlab.shrink()`` on every survivor that has not shrunk in the cell itself (its
variables and symmetric tensors stay; ``rank``,
``world_size``, ``comm`` are rebound) and renumbers the world's ``RankInfo``s.
``grow`` (``%dist_resize +N``) starts N engines that call ``commlab.init(join=True)``
while the members call ``commlab.grow(N)``, then hands the registered state (every
``commlab.elastic.State`` in rank 0's namespace, or the names given) to the newcomers
over commlab's own broadcast (``_worker.hand_over``).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

from commlab.engine import _worker
from commlab.engine._control import RankInfo
from commlab.engine._report import ranks_str
from commlab.engine._wait import wait_all
from commlab.errors import CommlabUsageError


class NotebookStore:
    """A TCPStore served by the notebook on ``addr`` (a free port), bound to that address
    only; the ranks' values in it carry their HMAC (``runtime/_auth.py``)."""

    def __init__(self, addr: str, world_size: int):
        import torch.distributed as dist

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, 0))
        self.sock.listen(512)
        self.addr, self.port = addr, self.sock.getsockname()[1]
        self.store: Any = dist.TCPStore(addr, self.port, world_size, is_master=True,
                                        wait_for_workers=False, timeout=timedelta(seconds=60),
                                        master_listen_fd=self.sock.fileno())

    def close(self) -> None:
        self.sock.close()  # as commlab.testing's parent store: the socket, then the server
        self.store = None


def continue_without(world, dead: list[int]) -> str:
    """``commlab.shrink()`` on every rank of ``world`` but ``dead`` (current numbers);
    renumbers ``world.ranks``; returns the sentence the cell's error ends with."""
    gone = {ri.eid for ri in world.ranks if ri.rank in dead}
    survivors = [ri for ri in world.ranks if ri.rank not in dead]
    for eid in gone:
        world.agents.pop(eid, None)
    if not survivors:
        world.broken = f"{ranks_str(dead)} died and no rank is left"
        return "No rank is left: run %dist_restart."
    pids = [ri.pid for ri in world.ranks if ri.rank in dead]
    infos = wait_all(world, [world.client[ri.eid].apply_async(_worker.shrink, pids)
                             for ri in survivors], what="shrinking to the survivors",
                     limit=max(60.0, world.timeout))
    old = [ri.rank for ri in survivors]
    world.ranks = sorted((RankInfo(i["rank"], ri.eid, ri.pid, ri.device, ri.host, ri.heap,
                                   ri.shared_gpu) for ri, i in zip(survivors, infos,
                                                                   strict=True)),
                         key=lambda ri: ri.rank)
    world.generation = infos[0]["generation"]
    n = len(survivors)
    return (f"The world continues with {ranks_str(old)} as {n} "
            f"{'rank' if n == 1 else 'ranks'} (renumbered 0..{n - 1}, generation "
            f"{world.generation}): their variables and symmetric tensors are kept; rank, "
            f"world_size and comm are updated. %dist_resize +{len(dead)} grows it back.")


def grow(world, n: int, names: list[str] | None, timeout: float) -> list[str]:
    """Admit ``n`` new engines into the running world (``commlab.grow``); returns the
    names handed to them."""
    import commlab

    if n < 1:
        raise CommlabUsageError(f"%dist_resize +N: N must be at least 1, got +{n}")
    if not hasattr(commlab, "grow"):
        raise CommlabUsageError(
            "%dist_resize +N grows in place through commlab.grow, which this commlab does "
            "not have yet; %dist_resize <N> rebuilds the world at the new size instead "
            "(symmetric tensors are lost)")
    if world.store is None:
        raise CommlabUsageError(
            f"%dist_resize +{n}: a world started with --launcher {world.plan.launcher} "
            f"cannot grow in place (its store lives on rank 0, and a new engine would need "
            f"a host); run %dist_start with more ranks")
    world.check_usable()
    if names:
        lacking = wait_all(world, [world.client[world.ranks[0].eid].apply_async(
            _worker.missing, names)], what="looking up the state", limit=30)[0]
        if lacking:
            raise CommlabUsageError(f"%dist_resize +{n} --state: rank 0 has no variable "
                                    f"{', '.join(lacking)}; name variables defined on rank 0")
    members = list(world.ranks)
    new = world._start_engines(n)
    where = wait_all(world, [world.client[e].apply_async(_worker.where) for e in new],
                     what="reporting their hosts", limit=120)
    for eid, (host, pid) in zip(new, where, strict=True):
        world.agents[eid] = world.hub.agent(host, pid)
    store = world.store
    joins = [world.client[e].apply_async(
        _worker.join_running, store.addr, store.port, world.requested_backend,
        world.size + i, world.relay.address, world.timeout)
        for i, e in enumerate(new)]
    grows = [world.client[ri.eid].apply_async(_worker.grow, n, timeout) for ri in members]
    infos = wait_all(world, grows + joins, what=f"growing by {n}", limit=timeout + 60)
    world.ranks = sorted(
        [RankInfo(i["rank"], ri.eid, ri.pid, ri.device, ri.host, ri.heap, ri.shared_gpu)
         for ri, i in zip(members, infos[:len(members)], strict=True)]
        + [RankInfo(i["rank"], e, i["pid"], i["device"], i["host"], i.get("heap", ""),
                    i.get("shared_gpu", "")) for e, i in zip(new, infos[len(members):],
                                                             strict=True)],
        key=lambda ri: ri.rank)
    world.generation = infos[0]["generation"]
    handed = wait_all(world, [world.client[ri.eid].apply_async(_worker.hand_over, names)
                              for ri in world.ranks], what="handing the state over",
                      limit=timeout)
    return list(handed[0])
