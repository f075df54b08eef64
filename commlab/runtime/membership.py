"""Who is in the world now: its members, its generation, and which members are lost.

One ``Membership`` per communicator; ``commlab.shrink()`` replaces it with the next
generation's. Everything that waits for peers asks it: the agreement
(``_control.ControlBlock._wait``), the interpreter's kernel waits (``_watch``), the shrink
(``agree`` below); the heap, the agreement block and the groups are rebuilt from what it
decides (``_shrink``).

**Lost.** On one host a member is its process: a pid whose ``/proc`` entry is gone or a
zombie is dead, and dead is final (a stopped process, SIGSTOP, is not lost). A member on
another host (``hosts``) is lost when its heartbeat in the store stops for the peer
timeout (``_beats``: its process died or its host's link was cut). A look reads
one small file per peer (~10 us), so waits look at most every ``min(0.05, T / 4)`` s,
``T`` = ``COMMLAB_PEER_TIMEOUT``: a kernel's wait checks every 50 ms
(``_interpreter.liveness``), the agreement at least that often, so a death is noticed well
within ``T``.

**Done, not lost.** A member that closed its communicator cleanly (``commlab.finalize``,
or the end of its process) after it published call ``n`` has done its part of every call
up to ``n``: a wait inside such a call (``check(..., call=...)``) keeps waiting for the
members still at work instead of raising because that member is gone. In a world of three,
rank 2 may finish and exit while rank 0 still waits for rank 1's signal. Each member's
left word lies in the agreement block and ``departed`` reads it; only the CPU backend's
waits ask (a GPU kernel's abort word has no call to compare with). A later call needs
the member again, and there it is lost.

**Agreeing on the survivors** (``agree``), through the world's store, which must outlive
the ranks (the launcher's or the parent's store; a store rank 0 served died with it, and
the shrink says so). A round over candidates ``M`` (the old members): each survivor writes
``arrive/r``, then waits until every ``r`` in ``M`` arrived or is dead; it proposes the
arrived members still alive and ``compare_set``s the proposal into ``decision`` (the first
proposal wins: every survivor adopts the same set). Each member of the decision prepares
(zeroes what it owns) and writes ``confirm/r``; once every member confirmed, the round
holds. A member that died before confirming fails the round on *every* survivor alike:
``/proc`` is not ordered with the store (a dying member's last write can still be in
flight when its death shows, and land later), so a survivor that sees a member dead
without its key does not decide alone: it ``compare_set``s the key to ``dead``, and the
member writes its own keys with ``compare_set`` too. Whichever write the store applies
first is the key's one value, read alike by every survivor: "confirmed" and "dead without
confirming" are the same verdict everywhere. A failed round runs again over the members
that confirmed (the same set everywhere), under new keys. A member that confirmed and
then died is in the new world and is lost there: the next collective raises, and shrink
runs again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from commlab import _config
from commlab.errors import CollectiveTimeoutError, CommlabError, RankLostError
from commlab.runtime._kill_points import reach

ABANDONED: list = []  # torch works and groups given up on a lost member (kept referenced)


def alive(pid: int) -> bool:
    """Whether the process ``pid`` lives (a zombie is dead: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@dataclass
class Membership:
    """The members of one generation of a world, numbered 0..world_size-1.

    ``pids``: each member's process; ``origin``: each member's rank at ``init``;
    ``store``: the world's (authenticated, prefixed) store, or None; ``store_rank``: the
    member whose process serves that store (rank 0's TCPStore), None when a launcher or
    the parent serves it; ``joined``: pids of members that joined (``commlab.grow``) and
    have not received a ``commlab.elastic.State`` since (the same on every member, so
    ``elastic.step`` syncs alike everywhere, even after a grow that ended in a loss)."""

    rank: int
    world_size: int
    pids: tuple[int, ...]
    store: dist.Store | None = None
    store_rank: int | None = None
    generation: int = 0
    origin: tuple[int, ...] = ()
    timeout: float = 300.0
    peer_timeout: float = field(default_factory=lambda: _config.get("COMMLAB_PEER_TIMEOUT"))
    joined: tuple[int, ...] = ()
    hosts: tuple[int, ...] = ()  # each member's host, across hosts only (else empty)
    beats: Any = field(default=None, repr=False)  # _beats.Beats, across hosts only
    keys: tuple[str, ...] = ()  # each member's heartbeat key, across hosts (default: origin)
    # the last call member r published before it closed cleanly, None while it has not
    departed: Callable[[int], int | None] | None = field(default=None, repr=False)
    _dead: set = field(default_factory=set, repr=False)
    _next: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if not self.origin:
            self.origin = tuple(range(self.world_size))
        self.look_s = min(0.05, self.peer_timeout / 4)

    # -- who is lost ----------------------------------------------------------------------
    def lost(self, *, now: bool = False) -> list[int]:
        """The members found dead (sorted); looks again only every ``look_s`` unless
        ``now``."""
        t = time.monotonic()
        if now or t >= self._next:
            self._next = t + self.look_s
            for r, pid in enumerate(self.pids):
                if r == self.rank or r in self._dead:
                    continue
                if self.hosts and self.hosts[r] != self.hosts[self.rank]:
                    if self.beats is not None and self.beats.silent(self.beat_key(r)):
                        self._dead.add(r)
                elif not alive(pid):
                    self._dead.add(r)
                    if self.beats is not None:  # across hosts: tell the other hosts
                        self.beats.report(self.beat_key(r))
        return sorted(self._dead)

    def beat_key(self, r: int) -> str:
        """Member ``r``'s heartbeat key (``_beats``): its rank at ``init``, or the one a
        grow gave it (a newcomer's rank at the join can repeat a dead member's)."""
        return self.keys[r] if self.keys else str(self.origin[r])

    def check(self, what: str, op: str | None = None, call: int | None = None) -> None:
        """Raise RankLostError if a member is lost (``what``: where this rank waits, e.g.
        ``"all_reduce #12"``; ``op``: the collective, default ``what``'s first word;
        ``call``: the call waited in, whose members that ``finished`` it are not lost
        for this wait); cheap enough to call in every spin."""
        if time.monotonic() >= self._next or self._dead:
            lost = self.lost()
            if lost and call is not None:
                lost = [r for r in lost if not self.finished(r, call)]
            if lost:
                raise self.error(lost, what, op)

    def finished(self, r: int, call: int) -> bool:
        """Whether member ``r`` closed cleanly after publishing ``call``: it has done its
        part of that call, so its absence does not stop a wait inside it."""
        at = self.left_at(r)
        return at is not None and at >= call

    def left_at(self, r: int) -> int | None:
        """The last call member ``r`` published before it closed cleanly (None: it has
        not, or nothing here can tell)."""
        return self.departed(r) if self.departed is not None else None

    def departures(self, ranks) -> list[str]:
        """"rank r closed its communicator after call #n" for each of ``ranks`` that
        closed cleanly (the errors of a wait it cannot serve say so)."""
        return [f"rank {r} closed its communicator after call #{at}" for r in ranks
                if (at := self.left_at(r)) is not None]

    def error(self, lost: list[int], what: str, op: str | None = None) -> RankLostError:
        survivors = [r for r in range(self.world_size) if r not in lost]
        op = what.split(" ")[0] if op is None else op
        gone = ", ".join(str(self.pids[r]) for r in lost)
        left = self.departures(lost)
        msg = (f"{what} on rank {self.rank}: {_ranks(lost)} of {self.world_size} "
               f"{'was' if len(lost) == 1 else 'were'} lost (pid {gone} gone), so it cannot "
               f"finish. ")
        if left:
            said = "; ".join(left)
            msg += (said[0].upper() + said[1:] + " (commlab.finalize, or its process ended): "
                    "every rank must make the same calls before it finalizes. ")
        if self.store_rank in lost:
            msg += (f"Rank {self.store_rank} served the world's store, so the survivors "
                    f"cannot agree on a smaller world: commlab.shrink() will refuse; start "
                    f"ranks that may die with a store the launcher serves (torchrun, or "
                    f"TORCHELASTIC_USE_AGENT_STORE=true)")
        else:
            now = (f"renumbered 0..{len(survivors) - 1}" if len(survivors) > 1 else
                   "alone, as rank 0")
            msg += (f"Call commlab.shrink() on every survivor: it continues with "
                    f"{_ranks(survivors)} {now}, symmetric tensors keeping their contents")
        return RankLostError(msg, lost, op or "")

    def behind(self, e: BaseException, what: str) -> RankLostError | None:
        """The RankLostError behind ``e``, an error of a host-side exchange (gloo says
        "Connection closed by peer"), or None. A dying process's sockets close a moment
        before ``/proc`` shows it dead, so such an error waits up to the peer timeout
        (plus two beats for a member on another host: its silence is seen that late)."""
        if isinstance(e, CommlabError):
            return None
        text = str(e)
        patient = any(w in text for w in ("Connection", "connection", "gloo", "peer"))
        wait = self.peer_timeout + (2.5 * self.beats.every if self.beats is not None else 0)
        deadline = time.monotonic() + (wait if patient else 0.0)
        while True:
            lost = self.lost(now=True)
            if lost:
                return self.error(lost, what)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def wait(self, work, what: str) -> None:
        """Wait for a torch.distributed ``work`` (an ``async_op=True`` call whose work
        completes on its own: gloo's reduce_scatter does not) while looking at the
        members: a lost one raises RankLostError instead of blocking until gloo's
        timeout. The abandoned work is kept referenced (``ABANDONED``): freeing a group
        with a receive still pending would wait for that timeout. No thread waits in it:
        one blocked there at exit hangs or aborts the process."""
        pause = 0.0001
        while not work.is_completed():
            try:
                self.check(what)
            except BaseException:
                ABANDONED.append(work)
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        work.wait()

    def wait_all(self, works: list, what: str) -> None:
        """``wait`` for each of ``works``; on a loss every one still pending is kept
        referenced too (``ABANDONED``)."""
        try:
            for work in works:
                self.wait(work, what)
        except BaseException:
            ABANDONED.extend(works)
            raise

    def share(self, name: str, value: str | None) -> str:
        """Member 0's ``value`` on every member, through the store (collective: every
        member calls it in the same order). The wait polls and checks the members, so a
        lost member raises RankLostError; a gloo exchange would block until its timeout
        on a live peer that left for ``shrink()``."""
        store = self.store
        assert store is not None
        self._shares = getattr(self, "_shares", 0) + 1
        key = f"share/g{self.generation}/{self._shares}/{name}"
        if self.rank == 0:
            assert value is not None
            store.set(key, value)
            return value
        pause = 0.0002
        while not store.check([key]):
            self.check(name)
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return store.get(key).decode()

    def leave(self, grace: float = 10.0) -> None:
        """Say this member is done with the world (``Communicator.close``). The member whose
        process serves the store then waits until every live member said so, at most
        ``grace`` s: a peer still reading the last ``share`` (or any store key) would
        otherwise lose the store mid-read ("Connection reset by peer")."""
        store = self.store
        if store is None or self.world_size == 1:
            return
        prefix = f"left/g{self.generation}/"
        try:
            store.set(prefix + str(self.rank), "1")
            if self.rank != self.store_rank:
                return
            deadline = time.monotonic() + grace
            pending = [r for r in range(self.world_size) if r != self.rank]
            while pending and time.monotonic() < deadline:
                lost = self.lost(now=True)
                pending = [r for r in pending
                           if r not in lost and not store.check([prefix + str(r)])]
                time.sleep(0.005)
        except (RuntimeError, OSError):  # the store is gone already: nobody can read it
            return

    # -- the next generation ----------------------------------------------------------------
    def shrunk(self, keep: list[int]) -> Membership:
        """The membership of the members ``keep`` (old ranks, ascending), renumbered."""
        return Membership(keep.index(self.rank), len(keep), tuple(self.pids[r] for r in keep),
                          self.store, None if self.store_rank not in keep else
                          keep.index(self.store_rank), self.generation + 1,
                          tuple(self.origin[r] for r in keep), self.timeout, self.peer_timeout,
                          tuple(p for p in self.joined if p in (self.pids[r] for r in keep)),
                          tuple(self.hosts[r] for r in keep) if self.hosts else (), self.beats,
                          tuple(self.keys[r] for r in keep) if self.keys else ())

    def grown(self, pids: tuple[int, ...], hosts: tuple[int, ...] = ()) -> Membership:
        """The membership with newcomers ``pids`` as ranks W..W+n-1 (``commlab.grow``);
        a newcomer's ``origin`` is its rank at the join. Across hosts ``hosts`` gives
        every member's host, and a newcomer's heartbeat key is ``g<generation>.<rank>``."""
        size = self.world_size + len(pids)
        keys = (tuple(self.beat_key(r) for r in range(self.world_size))
                + joined_keys(self.generation + 1, self.world_size, size)) if hosts else ()
        return Membership(self.rank, size, self.pids + tuple(pids), self.store,
                          self.store_rank, self.generation + 1,
                          self.origin + tuple(range(self.world_size, size)), self.timeout,
                          self.peer_timeout, self.joined + tuple(pids), hosts, self.beats,
                          keys)


def joined_keys(generation: int, first: int, size: int) -> tuple[str, ...]:
    """The heartbeat keys of the newcomers that a grow to ``generation`` made ranks
    ``first``..``size``-1."""
    return tuple(f"g{generation}.{r}" for r in range(first, size))


def agree(m: Membership, prepare: Callable[[list[int]], None]) -> tuple[list[int], str]:
    """The survivors every survivor agrees on (old ranks, ascending) and the store prefix
    of the round that decided (for the new groups' keys). ``prepare(decision)`` runs on
    this rank before it confirms the decision (see the module docstring)."""
    m.lost(now=True)
    if m.store_rank is not None and m.store_rank in m._dead:
        raise CommlabError(
            f"commlab.shrink on rank {m.rank}: rank {m.store_rank} served the world's store "
            f"and was lost with it, so the survivors cannot agree on a smaller world; start "
            f"ranks that may die with a store that outlives them (torchrun's agent store: "
            f"TORCHELASTIC_USE_AGENT_STORE=true; commlab.testing.run_world(store='parent'))")
    if m.store is None:
        raise CommlabError(f"commlab.shrink on rank {m.rank}: this world has no store "
                           f"(a world of one process cannot shrink)")
    candidates = list(range(m.world_size))
    deadline = time.monotonic() + m.timeout
    for attempt in range(m.world_size):
        prefix = f"shrink/g{m.generation}/a{attempt}"
        try:
            decision, confirmed = _round(m, prefix, candidates, prepare, deadline)
        except (RuntimeError, OSError) as e:  # the store's connection: its server is gone
            if isinstance(e, CommlabError):
                raise
            raise CommlabError(
                f"commlab.shrink on rank {m.rank}: the world's store stopped answering ({e}); "
                f"the process that served it is gone. Start ranks that may die with a store "
                f"that outlives them (TORCHELASTIC_USE_AGENT_STORE=true)") from None
        if confirmed == decision:
            return decision, prefix
        candidates = confirmed
    raise CommlabError(f"commlab.shrink on rank {m.rank}: no agreement after "
                       f"{m.world_size} rounds")


def _round(m: Membership, prefix: str, candidates: list[int],
           prepare: Callable[[list[int]], None],
           deadline: float) -> tuple[list[int], list[int]]:
    """One round: the decision and those of its members that confirmed it (both the
    same on every survivor)."""
    store = m.store
    assert store is not None
    reach("shrink.arrive")
    _write(store, f"{prefix}/arrive/{m.rank}", _WROTE)
    arrived = _wait_keys(m, f"{prefix}/arrive", candidates, deadline, "arrive at shrink")
    proposal = ",".join(str(r) for r in arrived if r not in m.lost(now=True))
    decided = store.compare_set(f"{prefix}/decision", "", proposal).decode()
    decision = [int(r) for r in decided.split(",") if r]
    if m.rank not in decision:
        raise CommlabError(f"commlab.shrink on rank {m.rank}: the survivors decided "
                           f"{_ranks(decision)} without this rank (it was seen dead)")
    reach("shrink.decided")
    prepare(decision)
    _write(store, f"{prefix}/confirm/{m.rank}", _WROTE)
    reach("shrink.confirmed")
    return decision, _wait_keys(m, f"{prefix}/confirm", decision, deadline,
                                "confirm the shrink")


_WROTE, _DEAD = "1", "dead"


def _write(store: dist.Store, key: str, value: str) -> bool:
    """Set ``key`` unless it holds a value already; whether ``value`` is its value now. A
    member's own key and a survivor's ``dead`` for it race through here: the store keeps
    the first (see the module docstring)."""
    return store.compare_set(key, "", value).decode() == value


def _wait_keys(m: Membership, prefix: str, ranks: list[int], deadline: float,
               what: str) -> list[int]:
    """Wait until each rank in ``ranks`` wrote ``prefix/r`` or died without writing it
    (the store's verdict: ``_write``); returns those that wrote it."""
    store = m.store
    assert store is not None
    pending, wrote = list(ranks), []
    pause = 0.0005
    while pending:
        for r in list(pending):
            key = [f"{prefix}/{r}"]
            if store.check(key):  # written: by r, or "dead" by a survivor
                pending.remove(r)
                if store.get(key[0]).decode() == _WROTE:
                    wrote.append(r)
            elif r in m.lost(now=True):  # dead: the store says whether its write won
                pending.remove(r)
                if not _write(store, key[0], _DEAD):
                    wrote.append(r)
        if not pending:
            break
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(
                f"commlab.shrink on rank {m.rank}: {_ranks(pending)} did not {what} within "
                f"{m.timeout:g} s and did not die; every survivor must call commlab.shrink() "
                f"after its RankLostError")
        time.sleep(pause)
        pause = min(pause * 2, 0.005)
    return sorted(wrote)
