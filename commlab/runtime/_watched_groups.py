"""torch.distributed groups over a world's members, connected in a thread the caller watches.

Connecting blocks in gloo until every member joined (or gloo's timeout), so it runs in a
thread while the caller watches the members; a member lost meanwhile makes the caller
give the attempt up and leave the thread to finish or fail on its own. A given-up thread
may still finish connecting (its member died once connected), and torch.distributed's
registry is process-wide: an ``init_process_group`` finishing in it took the group name
"0" from the next attempt ("A process group is already registered under the name0", CI
seed 13 of the fault runs) and would have made a stale group the default. So:

- the thread only *builds* (``Attempt.default``, ``Attempt.new_group``: the gloo rendezvous
  into group objects nobody else sees, as ``_new_process_group_helper`` makes them);
- the caller *registers* them all (names, ranks, tags, the default group), as
  ``init_process_group`` and ``new_group`` would, once the thread ended and only if the
  attempt is still its own;
- a given-up attempt's groups are shut down by whichever side comes last, and its
  thread builds nothing more.

Each attempt connects under a store prefix of its own, so nothing one left in the store
meets the next.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commlab.runtime._kill_points import reach
from commlab.runtime.membership import Membership


class GivenUp(Exception):
    """Raised in a given-up attempt's thread instead of building another group."""


class Attempt:
    """The groups one connect builds (``rank`` and ``size``: ours in its default group);
    registered by ``register``, or dropped by ``give_up``."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        self.store, self.rank, self.size, self.timeout = store, rank, size, timeout
        self._names = 0  # torch names unnamed groups by a count (per process, from 0)
        self._built: list[tuple] = []  # (group, backend, store, name, global -> group rank)
        self._lock = threading.Lock()
        self._given_up = self._ended = False

    # -- the connect thread: blocking, touches nothing process-wide -----------------------
    def default(self, backend: str = "gloo") -> dist.ProcessGroup:
        """The default group (gloo, or a plugin's such as "commlab") over all members."""
        name = self._name()
        store = dist.PrefixStore(f"{name}/", self.store)
        pg = self._build(backend, store, name, self.rank, self.size, [], "default_pg")
        return self._keep(pg, backend, store, name, {r: r for r in range(self.size)})

    def new_group(self, ranks: list[int] | None = None, backend: str = "gloo",
                  timeout: timedelta | None = None) -> dist.ProcessGroup:
        """``dist.new_group(ranks, backend=, timeout=)`` over ``default()``'s group: the
        same name, store keys and ranks."""
        assert self._built, "Attempt.new_group: make the default group first"
        ranks = sorted(range(self.size) if ranks is None else ranks)
        parent = self._built[0][2]
        name = self._name()
        if self.rank not in ranks:
            return dist.GroupMember.NON_GROUP_MEMBER  # type: ignore[return-value]  # torch's own sentinel
        store = dist.PrefixStore(f"{name}/", parent)
        pg = self._build(backend, store, name, ranks.index(self.rank), len(ranks), ranks,
                         "undefined", timeout)
        return self._keep(pg, backend, store, name, {g: i for i, g in enumerate(ranks)})

    def _name(self) -> c10d.GroupName:
        self._names += 1
        return c10d.GroupName(str(self._names - 1))

    def _build(self, backend: str, store: dist.Store, name: c10d.GroupName, rank: int, size: int,
               ranks: list[int], desc: str, timeout: timedelta | None = None):
        """One group as ``_new_process_group_helper`` builds it, less the registration."""
        if self._given_up:
            raise GivenUp
        timeout = timeout or self.timeout
        devices = list(c10d.BackendConfig(dist.Backend(backend)).get_device_backend_map())
        if backend == "gloo":
            pg = dist.ProcessGroup(store, rank, size)
            pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
            gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{devices[0]}/", store), rank,
                                         size, timeout)  # connects the full mesh
            gloo.options.global_ranks_in_group = ranks
            gloo.options.group_name = name
            gloo._set_sequence_number_for_group()
            for device in devices:
                pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO,
                                     gloo)
        else:  # a plugin whose creator returns its own ProcessGroup ("commlab")
            plugin = dist.Backend._plugins[backend.upper()]
            opts = c10d._DistributedBackendOptions()
            opts.store = dist.PrefixStore(f"{devices[0]}/", store)
            opts.group_rank, opts.group_size, opts.timeout = rank, size, timeout
            opts.group_id, opts.global_ranks_in_group = name, ranks
            pg = (plugin.creator_fn(opts, None) if plugin.extended_api else
                  plugin.creator_fn(opts.store, rank, size, timeout))
            if not isinstance(pg, dist.ProcessGroup):
                raise NotImplementedError(f"commlab: the {backend!r} backend's creator made "
                                          f"a {type(pg).__name__}, not a ProcessGroup")
        pg._set_group_name(name)
        pg._set_group_desc(desc)
        return pg

    def _keep(self, pg, backend: str, store: dist.Store, name: c10d.GroupName,
              ranks: dict[int, int]):
        with self._lock:
            if not self._given_up:
                self._built.append((pg, backend, store, name, ranks))
                return pg
        _shutdown([pg])
        raise GivenUp

    def ended(self) -> None:
        """The thread's last step: a given-up attempt's groups are shut down."""
        with self._lock:
            self._ended, drop = True, self._given_up
        if drop:
            _shutdown([b[0] for b in self._built])

    # -- the caller ---------------------------------------------------------------------
    def give_up(self) -> None:
        """Nothing of this attempt is ever registered; its groups are shut down (now,
        or when its thread ends)."""
        with self._lock:
            self._given_up, drop = True, self._ended
        if drop:
            _shutdown([b[0] for b in self._built])

    def register(self) -> None:
        """Register every group built, in order, the first as the default group (its
        thread has ended)."""
        assert self._ended and not self._given_up
        if dist.is_initialized():
            self.give_up()
            raise RuntimeError("commlab: torch.distributed's default group was made while "
                               "commlab connected its own")
        for i, (pg, backend, store, name, ranks) in enumerate(self._built):
            _register(pg, backend, store, name, ranks)
            if i == 0:
                c10d._update_default_pg(pg)
        c10d._world.group_count = self._names


def _register(pg, backend: str, store: dist.Store, name: c10d.GroupName,
              ranks: dict[int, int]) -> None:
    """The process-wide part of ``_new_process_group_helper`` and its callers."""
    backend = dist.Backend(backend)
    config = str(c10d.BackendConfig(backend))
    world = c10d._world
    if hasattr(c10d, "_register_pg_in_world"):  # torch 2.13
        c10d._register_pg_in_world(pg, backend_name=backend, store=store, group_name=name,
                                   backend_config=config, rank_mapping=ranks,
                                   add_to_default_tag=True)
        return
    world.pg_map[pg] = (backend, store)  # older torch: the same, inline in the helper
    world.pg_names[pg] = name
    world.pg_backend_config[pg] = config
    c10d._register_process_group(name, pg)
    world.pg_group_ranks[pg] = ranks
    world.tags_to_pg.setdefault("", []).append(pg)
    world.tags_to_pg.setdefault(f"ptd:{name}", []).append(pg)
    world.pg_to_tag[pg] = f"ptd:{name}"


def _shutdown(groups: list) -> None:
    for pg in groups:
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 - a group broken by the lost member: dropped anyway
            pass


def connect(members: Membership, store: dist.Store, timeout: timedelta,
            build: Callable[[Attempt], Any], point: str, what: str, op: str,
            name: str) -> Any:
    """torch.distributed's groups over ``members`` (the default group destroyed first):
    ``build(attempt)`` runs in a thread named ``name`` on ``store`` (a connection and
    prefix of this attempt's own) while this one watches the members (``point``: the
    kill point; ``what``, ``op``: the RankLostError's); its groups are registered here
    once it returned, and its result is returned. A member lost meanwhile, or gloo's
    error for one (``Membership.behind``), raises RankLostError and gives the attempt up."""
    if dist.is_initialized():
        dist.destroy_process_group()  # every group, and torch's name count back to 0
    attempt = Attempt(store, members.rank, members.world_size, timeout)
    box: dict = {}

    def run() -> None:
        try:
            box["made"] = build(attempt)
        except BaseException as e:  # noqa: BLE001 - raised by the waiting thread
            box["error"] = e
        finally:
            attempt.ended()

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    try:
        reach(point)
        while t.is_alive():
            t.join(0.005)
            if t.is_alive():
                members.check(what, op)
    except BaseException:
        attempt.give_up()
        raise
    if "error" in box:
        attempt.give_up()
        raise members.behind(box["error"], what) or box["error"]
    attempt.register()
    return box["made"]
