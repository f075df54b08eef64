"""Who is in the world now: its members, its generation, and which members are lost.

One ``Membership`` per communicator; ``commlab.shrink()`` replaces it with the next
generation's. Everything that waits for peers asks it: the agreement
(``_control.ControlBlock._wait``), the interpreter's kernel waits (``_watch``), the shrink
(``agree`` below); the heap, the agreement block and the groups are rebuilt from what it
decides (``_shrink``).

**Lost.** On one host a member is its process: a pid whose ``/proc`` entry is gone or a
zombie is dead, and dead is final (a stopped process, SIGSTOP, is not lost). A look reads
one small file per peer (~10 us), so waits look at most every ``min(0.05, T / 4)`` s,
``T`` = ``COMMLAB_PEER_TIMEOUT``: a kernel's wait checks every 50 ms
(``_interpreter.liveness``), the agreement at least that often, so a death is noticed well
within ``T``.

**Agreeing on the survivors** (``agree``), through the world's store, which must outlive
the ranks (the launcher's or the parent's store; a store rank 0 served died with it, and
the shrink says so). A round over candidates ``M`` (the old members): each survivor writes
``arrive/r``, then waits until every ``r`` in ``M`` arrived or is dead; it proposes the
arrived members still alive and ``compare_set``s the proposal into ``decision`` (the first
proposal wins: every survivor adopts the same set). Each member of the decision prepares
(zeroes what it owns) and writes ``confirm/r``; once every member confirmed, the round
holds. A member that died before confirming fails the round on *every* survivor alike: a
rank seen dead has its key read once more (the dead write nothing after they die), so
"confirmed" and "dead without confirming" are the same verdict everywhere. A failed round
runs again over the decision, under new keys. A member that confirmed and then died is
in the new world and is lost there: the next collective raises, and shrink runs again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from commlab import _config
from commlab.errors import CollectiveTimeoutError, CommlabError, RankLostError


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
    the parent serves it."""

    rank: int
    world_size: int
    pids: tuple[int, ...]
    store: dist.Store | None = None
    store_rank: int | None = None
    generation: int = 0
    origin: tuple[int, ...] = ()
    timeout: float = 300.0
    peer_timeout: float = field(default_factory=lambda: _config.get("COMMLAB_PEER_TIMEOUT"))
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
                if r != self.rank and r not in self._dead and not alive(pid):
                    self._dead.add(r)
        return sorted(self._dead)

    def check(self, what: str, op: str | None = None) -> None:
        """Raise RankLostError if a member is lost (``what``: where this rank waits, e.g.
        ``"all_reduce #12"``; ``op``: the collective, default ``what``'s first word);
        cheap enough to call in every spin."""
        if time.monotonic() >= self._next or self._dead:
            lost = self.lost()
            if lost:
                raise self.error(lost, what, op)

    def error(self, lost: list[int], what: str, op: str | None = None) -> RankLostError:
        survivors = [r for r in range(self.world_size) if r not in lost]
        op = what.split(" ")[0] if op is None else op
        gone = ", ".join(str(self.pids[r]) for r in lost)
        msg = (f"{what} on rank {self.rank}: {_ranks(lost)} of {self.world_size} "
               f"{'was' if len(lost) == 1 else 'were'} lost (pid {gone} gone), so it cannot "
               f"finish. ")
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
        before ``/proc`` shows it dead, so such an error waits up to the peer timeout."""
        if isinstance(e, CommlabError):
            return None
        text = str(e)
        patient = any(w in text for w in ("Connection", "connection", "gloo", "peer"))
        deadline = time.monotonic() + (self.peer_timeout if patient else 0.0)
        while True:
            lost = self.lost(now=True)
            if lost:
                return self.error(lost, what)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

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

    # -- the next generation ----------------------------------------------------------------
    def shrunk(self, keep: list[int]) -> Membership:
        """The membership of the members ``keep`` (old ranks, ascending), renumbered."""
        return Membership(keep.index(self.rank), len(keep), tuple(self.pids[r] for r in keep),
                          self.store, None if self.store_rank not in keep else
                          keep.index(self.store_rank), self.generation + 1,
                          tuple(self.origin[r] for r in keep), self.timeout, self.peer_timeout)

    def grown(self, pids: tuple[int, ...]) -> Membership:
        """The membership with newcomers ``pids`` as ranks W..W+n-1 (``commlab.grow``);
        a newcomer's ``origin`` is its rank at the join."""
        size = self.world_size + len(pids)
        return Membership(self.rank, size, self.pids + tuple(pids), self.store,
                          self.store_rank, self.generation + 1,
                          self.origin + tuple(range(self.world_size, size)), self.timeout,
                          self.peer_timeout)


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
            decision = _round(m, prefix, candidates, prepare, deadline)
        except (RuntimeError, OSError) as e:  # the store's connection: its server is gone
            if isinstance(e, CommlabError):
                raise
            raise CommlabError(
                f"commlab.shrink on rank {m.rank}: the world's store stopped answering ({e}); "
                f"the process that served it is gone. Start ranks that may die with a store "
                f"that outlives them (TORCHELASTIC_USE_AGENT_STORE=true)") from None
        if decision is not None:
            return decision, prefix
        candidates = [r for r in candidates if r not in m._dead]
    raise CommlabError(f"commlab.shrink on rank {m.rank}: no agreement after "
                       f"{m.world_size} rounds")


def _round(m: Membership, prefix: str, candidates: list[int],
           prepare: Callable[[list[int]], None], deadline: float) -> list[int] | None:
    store = m.store
    assert store is not None
    store.set(f"{prefix}/arrive/{m.rank}", "1")
    arrived = _wait_keys(m, f"{prefix}/arrive", candidates, deadline, "arrive at shrink")
    proposal = ",".join(str(r) for r in arrived if r not in m.lost(now=True))
    decided = store.compare_set(f"{prefix}/decision", "", proposal).decode()
    decision = [int(r) for r in decided.split(",") if r]
    if m.rank not in decision:
        raise CommlabError(f"commlab.shrink on rank {m.rank}: the survivors decided "
                           f"{_ranks(decision)} without this rank (it was seen dead)")
    prepare(decision)
    store.set(f"{prefix}/confirm/{m.rank}", "1")
    confirmed = _wait_keys(m, f"{prefix}/confirm", decision, deadline, "confirm the shrink")
    return decision if confirmed == decision else None


def _wait_keys(m: Membership, prefix: str, ranks: list[int], deadline: float,
               what: str) -> list[int]:
    """Wait until each rank in ``ranks`` wrote ``prefix/r`` or died without writing it;
    returns those that wrote it."""
    store = m.store
    assert store is not None
    pending, wrote = list(ranks), []
    pause = 0.0005
    while pending:
        for r in list(pending):
            key = [f"{prefix}/{r}"]
            if store.check(key):
                wrote.append(r)
                pending.remove(r)
            elif r in m.lost(now=True):  # dead: its key read once more after is final
                pending.remove(r)
                if store.check(key):
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
