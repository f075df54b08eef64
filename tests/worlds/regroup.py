"""Rank functions for the groups ``commlab.shrink()`` connects: a connect it gave up
that finishes while the next attempt connects (tests/test_elastic.py), and groups built in
the watched thread registered as torch registers its own (tests/test_watched_groups.py)."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import commlab
from commlab.runtime import _kill_points, _shrink
from tests.worlds.elastic import _note


class _GivesUp:
    """A membership whose watch reports a member lost once ``when()`` holds (as when a
    member died once it had connected): the attempt is given up, its thread left to
    finish on its own."""

    def __init__(self, members, when=lambda: True):
        self._members, self._when = members, when
        self.rank, self.world_size = members.rank, members.world_size

    def check(self, what: str, op: str | None = None) -> None:
        if self._when():
            raise self._members.error([2 if self.rank < 2 else 0], what, op)

    def behind(self, e: BaseException, what: str):
        return None


def _noted(note_dir: str, names: list[str]) -> bool:
    return all(os.path.exists(os.path.join(note_dir, n)) for n in names)


def _wait_for(note_dir: str, names: list[str]) -> None:
    deadline = time.monotonic() + 30
    while not _noted(note_dir, names):
        if time.monotonic() > deadline:
            notes = {n: open(os.path.join(note_dir, n)).read() for n in os.listdir(note_dir)}
            raise AssertionError(f"no note {names} after 30 s; the notes: {notes}")
        time.sleep(0.005)


def abandoned_connect_world(comm, note_dir: str, torch_backend: bool) -> dict:
    """Three ranks. Ranks 0 and 1 start connecting the survivors' group (attempt "a")
    and give it up (their watch says rank 2 was lost); once both connect attempt "b",
    rank 2 connects "a" (so 0's and 1's abandoned threads finish connecting it; rank 2
    gives "a" up once theirs ended, when it has not connected by then) and then "b".
    Every rank reports torch.distributed's default group (``torch_backend``: the
    "commlab" backend's, else commlab's gloo)."""
    if torch_backend:  # torch.distributed on "commlab" first, as a script under torchrun
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              size, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("commlab", store=dist.PrefixStore("regroup", store),
                                rank=rank, world_size=size)
        comm = commlab.init()
    world, members, rank = comm._world, comm.members, comm.rank
    timeout = comm.control.timeout
    out: dict = {}
    if rank < 2:
        try:
            _shrink._regroup(world, "a", _GivesUp(members), timeout, torch_backend)
        except commlab.RankLostError as e:
            out["a"] = f"RankLostError: {e.lost}"
        # the thread of attempt "a", still connecting (rank 2 has not begun it)
        left = [t for t in threading.enumerate() if t.name == "commlab-regroup"]
        threading.Thread(target=lambda: ([t.join() for t in left],
                                         _note(note_dir, f"a_ended{rank}", 1)),
                         daemon=True).start()
        _kill_points.arm("shrink.regroup", lambda: _note(note_dir, f"b_began{rank}", 1))
    else:
        _wait_for(note_dir, ["b_began0", "b_began1"])
        ended = ["a_ended0", "a_ended1"]
        try:
            _shrink._regroup(world, "a", _GivesUp(members, lambda: _noted(note_dir, ended)),
                             timeout, torch_backend)
            out["a"] = "connected"
        except commlab.RankLostError as e:
            out["a"] = f"RankLostError: {e.lost}"
        _wait_for(note_dir, ended)
    try:
        group, cpu_group, _ = _shrink._regroup(world, "b", members, timeout, torch_backend)
        out["b"] = "connected"
    except Exception as e:  # noqa: BLE001 - the failure this world is about, reported
        out["b"] = f"{type(e).__name__}: {e}"
    _note(note_dir, f"b{rank}", out["b"])
    _wait_for(note_dir, [f"b{r}" for r in range(3)])
    if all(open(os.path.join(note_dir, f"b{r}")).read() == "connected" for r in range(3)):
        default = dist.group.WORLD
        if torch_backend:  # "b"'s: live, and its own gloo connects the three ranks
            t = torch.full((3,), float(rank + 1))
            default.fallback.gloo.allreduce([t]).wait()
            out["default_is_b"] = not default.retired and t.tolist() == [6.0] * 3
        else:
            out["default_is_b"] = default is group
        out["backend"] = str(dist.get_backend())
        out["names"] = sorted(dist.distributed_c10d._world.pg_names.values())
        y = torch.full((7,), float(rank + 1))
        dist.all_reduce(y)  # over the default group
        z = torch.full((5,), float(rank + 1))
        dist.all_reduce(z, group=cpu_group)
        out["sums"] = [y.tolist(), z.tolist()]
    return out


class _AllHere:
    """Members that are never lost (``_watched_groups.connect``'s watch)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.world_size = rank, size

    def check(self, what: str, op: str | None = None) -> None:
        pass

    def behind(self, e: BaseException, what: str):
        return None


def _registry() -> dict:
    """torch.distributed's process-wide state about its groups, by group name."""
    c10d = dist.distributed_c10d
    w = c10d._world
    by_name = {pg: name for pg, name in w.pg_names.items()}
    groups = {}
    for pg, name in sorted(w.pg_names.items(), key=lambda x: x[1]):
        groups[name] = {
            "backend": str(w.pg_map[pg][0]), "store": type(w.pg_map[pg][1]).__name__,
            "config": w.pg_backend_config[pg], "ranks": w.pg_group_ranks[pg],
            "tag": w.pg_to_tag[pg], "desc": pg.group_desc, "name": pg.group_name,
            "rank": pg.rank(), "size": pg.size(), "get_backend": str(dist.get_backend(pg)),
            "devices": sorted(str(d) for d in pg._device_types),
            "resolved": c10d._resolve_process_group(name) is pg,
            "process_group_ranks": dist.get_process_group_ranks(pg)}
    return {"groups": groups, "default": by_name[dist.group.WORLD],
            "tags": {t: sorted(by_name[p] for p in pgs) for t, pgs in w.tags_to_pg.items()},
            "count": w.group_count, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "backend": str(dist.get_backend())}


def _use(groups: list) -> list:
    """A sum over the default group and over each of ``groups`` this rank is in, a
    gather of objects, and one more ``new_group`` (named after the others)."""
    out = []
    for g in [None, *groups]:
        if g is None or g != dist.GroupMember.NON_GROUP_MEMBER:
            t = torch.full((3,), float(dist.get_rank() + 1))
            dist.all_reduce(t, group=g)
            out.append(t.tolist())
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, {"rank": dist.get_rank()})
    later = dist.new_group([0, 1], backend="gloo")
    t = torch.ones(2)
    dist.all_reduce(t, group=later)
    return out + [got, later.group_name, t.tolist()]


def registered_like_torch_world(_, backend: str, legacy: bool) -> dict:
    """Two ranks make the default group (``backend``: "gloo" or "commlab") and gloo
    subgroups [0, 1] and [1] twice: built in ``_watched_groups.connect``'s thread and
    registered by it (``legacy``: as on a torch without ``_register_pg_in_world``), then
    by torch's own ``init_process_group`` and ``new_group``. Returns torch's registry
    after each, and what each could do."""
    from commlab.runtime import _watched_groups

    c10d = dist.distributed_c10d
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                         is_master=False, timeout=timedelta(seconds=60))
    limit = timedelta(seconds=30)
    saved = c10d.__dict__.pop("_register_pg_in_world") if legacy else None

    def build(attempt):
        return [attempt.default(backend), attempt.new_group([0, 1], backend="gloo"),
                attempt.new_group([1], backend="gloo")]

    try:
        made = _watched_groups.connect(_AllHere(rank, size), dist.PrefixStore("ours", base),
                                       limit, build, "shrink.regroup", "test", "test", "t")
    finally:
        if saved is not None:
            c10d._register_pg_in_world = saved
    ours = {"registry": _registry(), "default_is_first": dist.group.WORLD is made[0],
            "use": _use(made[1:])}
    dist.destroy_process_group()
    dist.init_process_group(backend, store=dist.PrefixStore("torch", base), rank=rank,
                            world_size=size, timeout=limit)
    subgroups = [dist.new_group([0, 1], timeout=limit, backend="gloo"),
                 dist.new_group([1], timeout=limit, backend="gloo")]
    torchs = {"registry": _registry(), "default_is_first": True, "use": _use(subgroups)}
    dist.destroy_process_group()
    return {"ours": ours, "torch": torchs}
