"""``commlab.grow(n)`` and ``commlab.init(join=True)``: newcomers enter a running world.

A newcomer takes a ticket from a counter in the world's store (``commlab/join``), writes
its pid under it and waits. The members call ``grow(n)`` together; one round under keys
never used before (``grow/g<generation>/a<attempt>`` in the members' store):

1. **arrive.** Each member writes its heap's fd and its arena's digest. Every member's
   kernels have ended (``synchronize`` first; a launch returns once its programs stopped).
2. **decide.** The member that takes ``decider`` waits for every member, then for n live
   newcomers in ticket order. A ticket is taken by compare-setting ``claim/<t>``, which a
   newcomer that gives up compare-sets too: it is either admitted or gone, never both. The
   decision carries the world (layout, arena, pids, settings); ``admit/<t>`` names rank W+i.
3. **map.** Newcomers create their heaps; every rank maps every heap (a member's segment,
   unlinked since init, through ``/proc/<pid>/fd/<fd>``); member 0 makes the agreement
   block for W+n. Each rank writes ``ready/<r>``, or ``fail/<r>`` with its error.
4. **verdict.** Every rank compare-sets ``verdict``: "go" once all are ready, else the
   abort (a failure, a death, the deadline). The first wins, so every rank acts alike. On
   abort the members keep the old world untouched (``RankLostError`` when a member died,
   else ``CommlabError``) and the newcomers raise.
5. **go.** Members zero their signal pad and flags (no old kernel can still write: all
   arrived), every rank installs the grown Communicator (generation + 1), then torch's
   default group is made again over W+n under the round's prefix, connected in a thread the
   new members watch: a death there is a ``RankLostError`` of the grown world (``shrink()``).

A newcomer's arena is member 0's: every block the members hold is held on the newcomer
too (``heap.inherited``, zeros) until ``commlab.elastic.State`` hands it out with contents.
A world across hosts takes the same round with the differences ``_grow_hosts`` names.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from commlab.errors import CollectiveTimeoutError, CommlabError, CommlabUsageError
from commlab.runtime import _auth, _bootstrap, _settings, _shm, _watched_groups
from commlab.runtime import communicator as _c
from commlab.runtime._control import ControlBlock
from commlab.runtime._cross import HostsAgreement
from commlab.runtime._devices import Placement
from commlab.runtime._kill_points import reach
from commlab.runtime.heap import FLAGS_BYTES, SIGNAL_PAD_BYTES, SymmetricHeap
from commlab.runtime.membership import Membership, alive

JOIN_PREFIX = "commlab/join"
_JOINS: dict = {}  # (addr, port) -> the authenticated join namespace of that store
_SEEN: dict = {}  # (addr, port) -> the first ticket not yet decided, as last read
PENDING_STATE = [False]  # this process joined and has not received a State yet
ACROSS_HOSTS: list = [None]  # (grow_across, join_across): runtime/_grow_hosts sets it


class _Aborted(Exception):
    """The round's verdict is an abort (its text)."""


def _pause(p: float) -> float:
    time.sleep(p)
    return min(p * 2, 0.005)


def _store_key() -> tuple[str, int]:
    port = os.environ.get("MASTER_PORT")
    if not port:
        raise CommlabUsageError(
            "commlab.init(join=True): MASTER_PORT is not set; start the newcomer with the "
            "running world's MASTER_ADDR and MASTER_PORT (a store that outlives ranks: "
            "TORCHELASTIC_USE_AGENT_STORE=true, or commlab.testing.run_world(store='parent'))")
    return os.environ.get("MASTER_ADDR", "127.0.0.1"), int(port)


def _joins(key: tuple[str, int], timeout: float) -> dist.Store:
    """The store's ``commlab/join`` namespace (connecting as a client if needed)."""
    if key not in _bootstrap._STORES:
        _bootstrap._STORES[key] = dist.TCPStore(key[0], key[1], None, is_master=False,
                                                timeout=timedelta(seconds=max(timeout, 30)))
    if key not in _JOINS:
        raw = dist.PrefixStore(JOIN_PREFIX, _bootstrap._STORES[key])
        _JOINS[key] = _auth.authenticated(raw, JOIN_PREFIX)
    return _JOINS[key]


def waiting(comm: _c.Communicator) -> int:
    """Newcomers registered at the world's store, alive and not yet admitted (this rank's
    look: ``commlab.elastic.step`` shares member 0's through the agreement)."""
    key = _store_key()
    if key not in _bootstrap._STORES:
        return 0
    joins = _joins(key, 30)
    total = joins.add("tickets", 0)
    if total < _SEEN.get(key, 1):  # the common case: one round trip
        return 0
    first = _SEEN[key] = int(joins.get("next")) if joins.check(["next"]) else 1
    count = 0
    for t in range(first, total + 1):
        if joins.check([f"ticket/{t}"]) and not joins.check([f"claim/{t}"]):
            count += ticket_alive(json.loads(joins.get(f"ticket/{t}")))
    return count


def machine() -> str:
    """This machine as its processes see it (hostname and boot): ``/proc`` tells about a
    pid only where a process's ``machine()`` is ours."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def ticket_alive(record: dict) -> bool:
    """Whether a newcomer's ticket (``{"pid", "machine"}``) is of a live process; one on
    another machine counts as alive (a grow's deadline covers it)."""
    if record.get("machine", machine()) != machine():
        return True
    return alive(record["pid"])


def _arena(heap: SymmetricHeap) -> dict:
    a = heap.arena
    return {"free": [list(f) for f in a._free], "used": sorted([o, s] for o, s in a._used.items())}


def _addr(m) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


class _Round:
    """One grow's keys: waits that end in the verdict every rank of the round reaches."""

    def __init__(self, store: dist.Store, prefix: str, pids: tuple[int, ...], rank: int,
                 deadline: float, gone: Callable[[int], bool] | None = None):
        self.store, self.prefix, self.pids, self.rank = store, prefix, pids, rank
        self.deadline, self._next = deadline, 0.0
        # whether rank r of the round is known dead (default: its pid, on this machine)
        self.gone = gone or (lambda r: not alive(self.pids[r]))

    def _abort(self, reason: str) -> _Aborted:
        got = self.store.compare_set(f"{self.prefix}/verdict", "", "abort: " + reason)
        return _Aborted(got.decode())

    def fail(self, reason: str) -> _Aborted:
        self.store.set(f"{self.prefix}/fail/{self.rank}", reason)
        return self._abort(f"rank {self.rank}: {reason}")

    def _problem(self, waiting_for: str) -> None:
        """Raise _Aborted when the round is over for this rank (checks throttled to 20 ms)."""
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + 0.02
        s, p = self.store, self.prefix
        if s.check([f"{p}/verdict"]):
            v = s.get(f"{p}/verdict").decode()
            if v != "go":
                raise _Aborted(v)
        for r, pid in enumerate(self.pids):
            if s.check([f"{p}/fail/{r}"]):
                raise self._abort(f"rank {r}: {s.get(f'{p}/fail/{r}').decode()}")
            if self.gone(r):
                raise self._abort(f"rank {r} (pid {pid}) died during the grow")
        if time.monotonic() > self.deadline:
            raise self._abort(f"{waiting_for} did not come before the grow's deadline")

    def wait(self, key: str, what: str) -> bytes:
        pause = 0.0002
        while not self.store.check([f"{self.prefix}/{key}"]):
            self._problem(what)
            pause = _pause(pause)
        return self.store.get(f"{self.prefix}/{key}")

    def heap(self, r: int, size: int):
        """Newcomer ``r``'s heap, mapped by the name it published in the round."""
        return _shm.open_existing(self.wait(f"heap/{r}", f"rank {r}'s heap").decode(), size)

    def verdict(self) -> str:
        """"go" once every rank is ready; else raises _Aborted (the same text everywhere)."""
        self.store.set(f"{self.prefix}/ready/{self.rank}", "1")
        for r in range(len(self.pids)):
            self.wait(f"ready/{r}", f"rank {r}'s ready")
        got = self.store.compare_set(f"{self.prefix}/verdict", "", "go").decode()
        if got != "go":
            raise _Aborted(got)
        return got


# -- members ------------------------------------------------------------------------------

def begin(old, m: Membership, limit: float) -> tuple:
    """A member's start of a grow round (also across hosts): kernels ended, garbage
    collected alike; the round's ``(key, joins, store, prefix, arena)``."""
    old.synchronize()  # calls that ran ahead are checked: this rank's kernels have ended
    gc.collect()  # blocks dead in cycles return to the arena on every member alike
    key, attempt = _store_key(), getattr(m, "_grows", 0) + 1
    setattr(m, "_grows", attempt)  # noqa: B010 - a counter on the members' object
    prefix = f"grow/g{m.generation}/a{attempt}"
    return key, _joins(key, limit), m.store, prefix, _arena(old.heap)


def grow(n: int, timeout: float | None = None) -> _c.Communicator:
    """Admit ``n`` newcomers (processes in ``commlab.init(join=True)``) as ranks W..W+n-1;
    returns the new default Communicator (also ``commlab.get_communicator()``).
    Collective over the members; waits at most ``timeout`` s (default: the
    communicator's) for the newcomers to register, else raises on every member and the
    world continues unchanged."""
    old = _c.get_communicator()
    m, control, world = old.members, old.control, old._world
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CommlabUsageError(f"commlab.grow: n must be a positive int, got {n!r}")
    if (old.backend != "cpu" or m is None or m.store is None or world is None
            or (old.across is not None and world.store_rank is not None)
            or not isinstance(control, ControlBlock if old.across is None else HostsAgreement)):
        raise CommlabUsageError(
            "commlab.grow: only a cpu world whose store outlives ranks can grow yet; start "
            "it with TORCHELASTIC_USE_AGENT_STORE=true (python -m commlab.run, or "
            "run_world(store='parent')) and backend='cpu'")
    if not world.owns_pg or (dist.is_initialized() and str(dist.get_backend()) != "gloo"):
        raise CommlabUsageError(
            "commlab.grow: torch.distributed's default group was not made by commlab.init "
            "on gloo, so it cannot be rebuilt; start the world without "
            "COMMLAB_TORCH_BACKEND=commlab")
    if m.world_size + n > 64:
        raise CommlabUsageError(f"commlab.grow({n}): {m.world_size} + {n} ranks exceeds 64")
    limit = control.timeout if timeout is None else float(timeout)
    if old.across is not None:
        return ACROSS_HOSTS[0][0](old, n, limit)
    key, joins, store, prefix, arena = begin(old, m, limit)
    heap = old.heap
    reach("grow.arrive")
    store.set(f"{prefix}/arrive/{m.rank}", json.dumps(
        {"pid": os.getpid(), "fd": heap.fd, "arena": hashlib.sha1(
            json.dumps(arena).encode()).hexdigest()}))
    if store.compare_set(f"{prefix}/decider", "", str(m.rank)).decode() == str(m.rank):
        _decide(old, m, joins, store, prefix, n, limit, arena, key)
    decision = json.loads(_member_wait(m, store, f"{prefix}/decision", limit + 60))
    if "abort" in decision:
        raise CollectiveTimeoutError(f"commlab.grow({n}) on rank {m.rank}: "
                                     f"{decision['abort']}; the world continues unchanged "
                                     f"with its {m.world_size} ranks")
    w = decision["world"]
    size, pids = w["size"], tuple(w["pids"])
    rnd = _Round(store, prefix, pids, m.rank, time.monotonic() + w["phase_s"])
    keep: list = []
    try:
        try:
            keep += [rnd.heap(r, heap.layout.size) for r in range(m.world_size, size)]
            keep.append(_control_block(rnd, m.rank, w["token"], size))
        except OSError as e:  # a segment gone: its owner died, or the round aborted
            raise rnd.fail(f"cannot map a newcomer's heap or the agreement block ({e})") \
                from None
        reach("grow.ready")
        rnd.verdict()
    except _Aborted as e:
        unlink_round(w)
        lost = m.lost(now=True)
        if lost:
            raise m.error(lost, "commlab.grow", "grow") from None
        raise CommlabError(f"commlab.grow({n}) on rank {m.rank}: {e}; the world continues "
                           f"unchanged with its {m.world_size} ranks") from None
    unlink_round(w)
    lay = heap.layout
    heap.region(lay.signal_pad, SIGNAL_PAD_BYTES + FLAGS_BYTES, torch.uint8).zero_()
    heap.bases = heap.bases + [_addr(mp) for mp in keep[:-1]]
    members = m.grown(pids[m.world_size:])
    world = dataclasses.replace(world, world_size=size, placement=Placement(("",) * size))
    old.closed = True  # retired: its heap and mappings live on in the grown one
    old.plans.clear()
    comm = _install(members, heap, keep[-1], control.timeout, world, old._keep + keep)
    _connect(comm, prefix, "grow.commit")
    return comm


def _member_wait(m: Membership, store: dist.Store, key: str, limit: float) -> bytes:
    deadline, pause = time.monotonic() + limit, 0.0002
    while not store.check([key]):
        m.check("commlab.grow", "grow")  # a lost member: RankLostError, old world intact
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(f"commlab.grow on rank {m.rank}: no {key} within "
                                         f"{limit:g} s; every member must call commlab.grow")
        pause = _pause(pause)
    return store.get(key)


def _decide(old, m: Membership, joins, store, prefix: str, n: int, limit: float,
            arena: dict, key) -> None:
    """The decider's part: every member arrived, n newcomers claimed, the decision."""
    arrivals = [json.loads(_member_wait(m, store, f"{prefix}/arrive/{r}", limit + 60))
                for r in range(m.world_size)]
    if len({a["arena"] for a in arrivals}) > 1:
        store.set(f"{prefix}/decision", json.dumps({"abort": (
            "the members' symmetric heaps hold different blocks (a tensor alive on some "
            "ranks only); free or keep symmetric tensors alike on every rank")}))
        return
    chosen = _claim(m, joins, prefix, n, time.monotonic() + limit)
    world = old._world
    size = m.world_size + len(chosen)
    if len(chosen) < n:
        for t, _ in chosen:
            joins.set(f"admit/{t}", json.dumps({"abort": "the grow found too few newcomers"}))
        store.set(f"{prefix}/decision", json.dumps({"abort": (
            f"{len(chosen)} of {n} newcomers registered within {limit:g} s; start them "
            f"with commlab.init(join=True) and this world's MASTER_ADDR/MASTER_PORT, or "
            f"pass a longer timeout")}))
        return
    w = {"size": size, "members": m.world_size, "pids": list(m.pids) + [p for _, p in chosen],
         "origin": list(m.origin), "generation": m.generation + 1,
         "joined": list(m.joined) + [p for _, p in chosen],
         "store_rank": m.store_rank, "layout": [old.heap.layout.size,
                                                old.heap.layout.scratch_bytes],
         "timeout": old.control.timeout, "token": world.token, "arena": arena,
         "fds": [[a["pid"], a["fd"]] for a in arrivals], "phase_s": max(limit, 10.0),
         "settings": _settings.settings({}), "peer_timeout": m.peer_timeout,
         "hosts": old.hosts if old.across is not None else None, "arrivals": arrivals,
         "keys": [m.beat_key(r) for r in range(m.world_size)]}
    store.set(f"{prefix}/decision", json.dumps({"world": w}))
    gen = _bootstrap._GENERATIONS[key]
    for i, (t, _) in enumerate(chosen):
        joins.set(f"admit/{t}", json.dumps({"store": gen, "prefix": prefix,
                                            "rank": m.world_size + i}))


def _claim(m: Membership, joins, prefix: str, n: int, deadline: float) -> list:
    """Up to ``n`` (ticket, pid) of live newcomers in ticket order, each claimed for
    this round; dead ones are claimed as "dead" and skipped for good."""
    t = int(joins.get("next")) if joins.check(["next"]) else 1
    chosen: list = []
    pause = 0.0005
    while len(chosen) < n:
        total = joins.add("tickets", 0)
        while t <= total and len(chosen) < n and joins.check([f"ticket/{t}"]):
            record = json.loads(joins.get(f"ticket/{t}"))
            pid = record["pid"]
            mark = prefix if ticket_alive(record) else "dead"
            if joins.compare_set(f"claim/{t}", "", mark).decode() == prefix:
                chosen.append((t, pid))
            t += 1
        if len(chosen) == n or time.monotonic() > deadline:
            break
        m.check("commlab.grow (waiting for newcomers)", "grow")
        pause = _pause(pause)
    joins.set("next", str(t))
    return chosen


def _control_block(rnd: _Round, rank: int, token: str, size: int):
    """The grown world's agreement block: member 0 creates it, the others open it."""
    nbytes = ControlBlock.nbytes(size)
    if rank == 0:
        name = _shm.segment_name(token, "grow", 0)
        block = _shm.create(name, nbytes)
        rnd.store.set(f"{rnd.prefix}/ctl", name)
        return block
    return _shm.open_existing(rnd.wait("ctl", "rank 0's agreement block").decode(), nbytes)


def unlink_round(w: dict) -> None:
    """Unlink the round's segments: the newcomers' heaps and the grown agreement block.
    Every rank does it once the verdict is out (go: every rank has mapped them; abort:
    nobody will), so a segment whose creator died is not left behind."""
    pids = w["pids"]
    for r in range(w["members"], w["size"]):
        _shm.unlink(_shm.segment_name(w["token"], "heap", r, pids[r]))
    _shm.unlink(_shm.segment_name(w["token"], "grow", 0, pids[0]))


def _install(members: Membership, heap: SymmetricHeap, block_map, timeout: float, world,
             keep: list) -> _c.Communicator:
    """The grown world's Communicator, made this process's (its group comes next)."""
    rank, size = members.rank, members.world_size
    block = ControlBlock(block_map, rank, size, timeout)
    block.members = members
    lay = heap.layout
    ctx = torch.tensor([rank, size, heap.bases[rank] + lay.signal_pad,
                        heap.bases[rank] + lay.flags] + heap.bases + [0], dtype=torch.int64)
    comm = _c.Communicator(rank, size, "cpu", torch.device("cpu"), ctx, heap, block,
                           world.group, world.cpu_group, world.local_rank, world, keep,
                           members=members)
    _c.watch_kernels(comm)
    _c.install(comm)
    return comm


def _connect(comm: _c.Communicator, prefix: str, point: str) -> None:
    """torch.distributed's default group over the grown world. Connecting blocks in gloo
    until every rank joined, so it runs in a thread while this one watches the members
    (``point``: this side's kill point, ``grow.commit`` or ``join.commit``)."""
    assert comm.members is not None and comm._world is not None
    pg, _ = connect_group(comm.members, prefix, point)
    comm.group = comm.cpu_group = pg
    comm._world = dataclasses.replace(comm._world, group=pg, cpu_group=pg)


def connect_group(members: Membership, prefix: str, point: str,
                  then: Callable | None = None) -> tuple[dist.ProcessGroup, Any]:
    """``_connect``'s default group over ``members``, and what ``then(attempt)`` returned
    (run in the same thread once the group is built: the groups of a world across hosts).
    The thread only builds them; they are registered here once it connected
    (``_watched_groups.connect``: a connect given up leaves nothing behind)."""
    assert members.store is not None
    # a connection of its own: a thread left blocked in gloo's rendezvous (a rank died)
    # would otherwise hold the store's one socket until gloo's timeout, and with it every
    # store call of this process (shrink's agreement included)
    clone = getattr(members.store, "clone", None)
    store = dist.PrefixStore(f"{prefix}/pg", clone() if clone is not None else members.store)

    def build(attempt: _watched_groups.Attempt) -> tuple:
        pg = attempt.default("gloo")
        return pg, then(attempt) if then is not None else None

    limit = timedelta(seconds=max(members.timeout, 30))
    return _watched_groups.connect(members, store, limit, build, point,
                                   "commlab.grow (connecting the grown world's group)",
                                   "grow", "commlab-grow-group")
