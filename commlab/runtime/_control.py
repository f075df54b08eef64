"""Host-side agreement before every collective: same op, same shapes, everyone present.

Every rank owns a ring of ``RING`` 256-byte slots in a small shared-memory block (all ranks
live on one host). Entering collective number ``n``, a rank writes its *signature* (op,
dtype, shape, parameters, or the local error it found) into slot ``n % RING`` and then
publishes ``n``; it waits until every peer has published ``n`` and compares signatures. So a bad
argument on one rank raises a clear error on *every* rank before any kernel launches,
and a collective called on only some ranks ends in a ``CollectiveTimeoutError`` that
says who is missing and where they are, instead of a silent hang. A member that died
(``runtime.membership``) ends every wait with ``RankLostError`` at once.

A slot's header is (seq, length, a 64-bit digest of the signature). A call checked
after it ran ahead (``_ahead``) compares the peers' digests with its own (two different
signatures pass with probability 2^-64); the full comparison, with its message, runs on
any difference. A launch plan publishes a fixed ``Record`` (``repeat``): when its slot
already holds that record, only the seq word is written.

A signature longer than its slot keeps its first bytes (short fields first, so the op,
dtype and parameters survive a long shape) and ends with a digest of the whole encoding:
two calls that differ anywhere, even past the slot's end, never publish the same bytes.

How long to wait: the communicator's timeout, or, inside ``call_timeout(s)``, ``s`` (a
torch.distributed group's own timeout for the calls made through it); the host waits of
kernels (``runtime/_watch``) use the same limit. A peer process that died is named within
about 50 ms instead of at the limit (ranks of one host: the pid each rank shared at init).

One thread at a time: a second thread entering the agreement of a communicator while
another is inside it is refused with a ``CommlabUsageError`` (two threads would publish
into one sequence and break the world for good). Call a communicator's collectives from
one thread, or serialize them with your own lock in the same order on every rank.

A slot is never overwritten before every peer read it: a rank publishes ``n`` only once
every peer's *checked* word (the last call it finished comparing) is at least
``n - RING``. A call that waited is never held by this: having passed check ``n - 1``, every
peer published ``n - 1``, so it had checked ``n - 2``. Calls that skip the wait (a repeated
call of an agreed plan, ``commlab.runtime._ahead``) are checked later; the ring bounds
how far a rank may run ahead of its peers' checks.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from typing import TYPE_CHECKING

from commlab import _config
from commlab._interpreter import liveness
from commlab.errors import CollectiveTimeoutError, CommlabUsageError, RankMismatchError
from commlab.runtime._ahead import SYNC_HOOK, Ahead
from commlab.runtime._signature import _CUT, _DIGEST, _HDR, SLOT, Record, Signature, digest

if TYPE_CHECKING:
    from commlab.runtime.membership import Membership

RING = 8  # slots per rank: how many calls may be published before peers check them
_STATE, NOTES = 64, 4  # per rank, after the slots: the checked word, then NOTES note words
_LEFT = 1 + NOTES  # then the left word: 1 + the last call published, once the rank closed
_AHEAD_BIT = 1 << 32  # in the length word: published without waiting (see _ahead)
_WORD = struct.Struct("<qq")  # length, digest: written together after the body
ACTIVE: list = [None]  # the newest ControlBlock: the kernels' watch names absent ranks
CALL_TIMEOUT: list = [None]  # seconds for the calls in progress (call_timeout), else None


@contextlib.contextmanager
def call_timeout(seconds: float | None):
    """Every wait of the calls made inside (agreement, kernels' host waits) gives up after
    ``seconds`` (None: the communicator's timeout)."""
    before = CALL_TIMEOUT[0]
    CALL_TIMEOUT[0] = seconds
    try:
        yield
    finally:
        CALL_TIMEOUT[0] = before


def limit(default: float) -> float:
    """The timeout in force: ``call_timeout``'s, else ``default``."""
    return default if CALL_TIMEOUT[0] is None else CALL_TIMEOUT[0]


def _ranks_str(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class ControlBlock:
    RING = RING
    SLOT_WORDS = SLOT >> 3

    def __init__(self, buf, rank: int, world_size: int, timeout: float):
        self.buf = buf  # mmap of nbytes(world_size)
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.seq = 0  # collectives entered by this rank
        self.waits = 0  # calls that waited for every rank (the rest ran ahead)
        self._lock = threading.Lock()  # held while a thread is inside agree()
        self._inside: tuple = (None, "")  # that thread and op, for the refusal
        self.peers = [r for r in range(world_size) if r != rank]
        self.ahead = Ahead(self, _config.get("COMMLAB_AGREE_AHEAD"))
        self.entered = 0  # agree() calls begun: a local error before one is published
        self.last_published = 0  # the newest call this rank published
        self.words = memoryview(buf).cast("q")  # the block as int64 words (seq, checked)
        self._mine: list = [None] * RING  # the Record each of our slots holds, if any
        self.checked_word = self._state(rank) >> 3  # our checked word's index in words
        ACTIVE[0] = self
        self.members: Membership | None = None  # the world's members: every wait checks them

    @staticmethod
    def nbytes(world_size: int) -> int:
        return world_size * (RING * SLOT + _STATE)

    def _slot(self, rank: int, seq: int) -> int:
        return (rank * RING + seq % RING) * SLOT

    def _state(self, rank: int) -> int:
        return self.world_size * RING * SLOT + rank * _STATE

    def checked(self, rank: int) -> int:
        """The last call ``rank`` finished comparing with every peer's."""
        return self.words[self._state(rank) >> 3]

    def set_checked(self, n: int) -> None:
        self.words[self._state(self.rank) >> 3] = n

    def set_note(self, value: int, word: int = 0) -> None:
        """Word ``word`` (of NOTES) peers read after this rank's next published call
        (online selection: rank 0's decisions). Written before the publish, so a peer
        that saw the call sees it; a word is written again only once every peer read it
        (``collectives._adapt``)."""
        self.words[(self._state(self.rank) >> 3) + 1 + word % NOTES] = value

    def note(self, rank: int, word: int = 0) -> int:
        return self.words[(self._state(rank) >> 3) + 1 + word % NOTES]

    def leave(self) -> None:
        """Say this rank closed its communicator cleanly (``Communicator.close``, after its
        device finished): every call it published is done on its side."""
        self.words[(self._state(self.rank) >> 3) + _LEFT] = self.last_published + 1

    def left_after(self, rank: int) -> int | None:
        """The last call ``rank`` published before it closed cleanly; None while it has
        not (``Membership.finished`` asks)."""
        v = self.words[(self._state(rank) >> 3) + _LEFT]
        return v - 1 if v else None

    def _published(self, rank: int) -> int:
        return max(_HDR.unpack_from(self.buf, self._slot(rank, s))[0] for s in range(RING))

    def published(self, rank: int, seq: int) -> bool:
        return self.words[(rank * RING + seq % RING) * (SLOT >> 3)] >= seq

    def digest_of(self, rank: int, seq: int) -> int:
        """The digest ``rank`` published with call ``seq``."""
        return self.words[(rank * RING + seq % RING) * (SLOT >> 3) + 2]

    def wait_published(self, rank: int, seq: int, op: str) -> None:
        """Return once ``rank`` has published call ``seq`` (online selection: its note
        of that call is written); the timeout and a lost rank end it as any wait."""
        if not self.published(rank, seq):
            self._wait(seq, Signature(op, {}),
                       lambda r: r != rank or self.published(rank, seq), "publish")

    def went_ahead(self, rank: int, seq: int) -> bool:
        """Whether ``rank`` published ``seq`` without waiting (it has launched already)."""
        return bool(_HDR.unpack_from(self.buf, self._slot(rank, seq))[1] & _AHEAD_BIT)

    def ring_free(self, n: int) -> bool:
        """Whether publishing ``n`` overwrites only slots every peer has checked."""
        words, base, low = self.words, self.world_size * RING * (SLOT >> 3), n - RING
        for r in self.peers:
            if words[base + r * (_STATE >> 3)] < low:
                return False
        return True

    def _read(self, rank: int, seq: int) -> Signature:
        return Signature.decode(self._raw(rank, seq))

    def agree(self, sig: Signature, raw: bytes | None = None, *, ahead: bool = False) -> int:
        """Publish ``sig`` (``raw``: its encoding, when the caller cached it), wait for every
        rank, raise if any rank disagrees. Returns the sequence number.

        ``ahead``: the caller holds a cached plan for ``raw``; the call may then return
        without waiting and be checked later (``commlab.runtime._ahead`` says when)."""
        self.entered += 1
        if not self._lock.acquire(blocking=False):
            inside, op = self._inside
            raise CommlabUsageError(
                f"{sig.op} on rank {self.rank}: thread {threading.current_thread().name!r} "
                f"called a collective while thread {inside.name!r} ({op}) is inside one "
                f"on the same "
                f"communicator; call a communicator's collectives from one thread at a time "
                f"(serialize them with a lock, in the same order on every rank)")
        try:
            self._inside = (threading.current_thread(), sig.op)
            if raw is None:
                raw = sig.encode()
            if ahead and SYNC_HOOK[0] is None and self.ahead.may_skip(raw, self.seq + 1):
                return self.ahead.publish(sig, raw)
            return self._agree(sig, raw)
        except BaseException:
            self.ahead.last = None  # the next call waits
            raise
        finally:
            self._lock.release()

    def record(self, sig: Signature, raw: bytes | None = None) -> Record:
        """The fixed record ``repeat`` publishes for ``sig`` (made once per launch plan)."""
        raw = sig.encode() if raw is None else raw
        return Record(sig, raw, digest(raw))

    def repeat(self, rec: Record) -> int:
        """``agree(rec.sig, rec.raw, ahead=True)`` for a launch plan's record, in a few
        Python steps when the call may run ahead (``Ahead.repeat``)."""
        return self.ahead.repeat(rec)

    def settle(self) -> None:
        """Check every call that ran ahead (waits for peers to publish them); raises the
        mismatch one of them had, the same error the peers raise."""
        with self._lock:
            try:
                self.ahead.settle()
            except BaseException:
                self.ahead.last = None
                raise

    def publish_record(self, n: int, rec: Record) -> None:
        """Publish call ``n`` ahead with a plan's record: its body, length and digest only
        when our slot does not hold them already, then ``n``."""
        k = n % RING
        off = (self.rank * RING + k) * SLOT
        if self._mine[k] is not rec:
            self._write(off, rec.raw, rec.digest, True)
            self._mine[k] = rec
        self.words[off >> 3] = n  # publish: one aligned 8-byte store, after the body
        self.last_published = n

    def _write(self, off: int, raw: bytes, dig: int, ahead: bool) -> None:
        self.buf[off + _HDR.size : off + _HDR.size + len(raw)] = raw
        _WORD.pack_into(self.buf, off + 8, len(raw) | (_AHEAD_BIT if ahead else 0), dig)

    def publish(self, n: int, raw: bytes, *, ahead: bool = False) -> int:
        """Write call ``n``'s signature into our slot, then ``n``; returns its digest."""
        off = self._slot(self.rank, n)
        dig = digest(raw)
        self._write(off, raw, dig, ahead)
        self._mine[n % RING] = None
        # publish last, with one aligned 8-byte store: a peer that sees seq n also
        # sees the body, length and digest written above (x86 keeps stores in order)
        SYNC_HOOK[0] and SYNC_HOOK[0]("publish", self.rank, n)
        self.words[off >> 3] = n
        self.last_published = n
        return dig

    def _agree(self, sig: Signature, raw: bytes) -> int:
        self.ahead.settle()  # every earlier call is checked before this one waits
        n = self.seq + 1
        if not self.ring_free(n):
            self._wait(n, sig, lambda r: self.checked(r) >= n - RING, f"check #{n - RING}")
        self.publish(n, raw)
        try:
            self._wait_all(n, sig)
            SYNC_HOOK[0] and SYNC_HOOK[0]("join", self.rank, n)
        except BaseException:
            self.words[self._slot(self.rank, n) >> 3] = max(n - RING, 0)  # withdraw
            raise
        self.seq = n
        self.set_checked(n)
        self.waits += 1
        # fast path: every peer published byte-identical arguments and no local error
        if sig.error or any(self._raw(r, n) != raw for r in range(self.world_size)
                            if r != self.rank):
            self.ahead.drain(n)  # peers that launched already get their kernel's partner
            self._compare(n, sig, raw)
        self.ahead.last = raw
        return n

    def _raw(self, rank: int, seq: int) -> bytes:
        off = self._slot(rank, seq)
        length = _HDR.unpack_from(self.buf, off)[1] & (_AHEAD_BIT - 1)
        return bytes(self.buf[off + _HDR.size : off + _HDR.size + length])

    def _wait_all(self, n: int, sig: Signature) -> None:
        self._wait(n, sig, lambda r: self.published(r, n), "arrive")

    def _wait(self, n: int, sig: Signature, done, what: str) -> None:
        """Spin until ``done(r)`` for every peer ``r``; the timeout names who is missing."""
        pending = [r for r in range(self.world_size) if r != self.rank]
        start = None
        spins = 0
        while pending:
            pending = [r for r in pending if not done(r)]
            if not pending:
                return
            spins += 1
            if start is None:
                start = time.monotonic()
            if spins > 200:
                # back off: on small machines the ranks we wait for need this core
                time.sleep(0 if spins < 2000 else 0.0005)
            if spins % 64 == 0:
                waited = time.monotonic() - start
                if self.members is not None:  # a lost member: no call can finish
                    self.members.check(f"{sig.op} #{n}", call=n)
                elif waited > 0.05:
                    self._check_alive(n, sig, pending)
                if waited > limit(self.timeout):
                    self._timeout(n, sig, pending, what)

    def _check_alive(self, n: int, sig: Signature, pending: list[int]) -> None:
        """Raise at once when a rank we wait for is a process that died."""
        watch = liveness.current()
        dead = getattr(watch, "dead", None)
        gone = [r for r in dead() if r in pending] if dead is not None else []
        if gone:
            raise CollectiveTimeoutError(
                f"{sig.op} #{n} on rank {self.rank}: {_ranks_str(gone)} died (process ended) "
                f"before arriving; the collective cannot complete and the world cannot go "
                f"on: restart it")

    def _where(self, missing: list[int]) -> list[str]:
        where = []
        for r in missing:
            last = self._published(r)
            if last == 0:
                where.append(f"rank {r} has not entered any collective")
            else:
                where.append(f"rank {r} last entered {self._read(r, last).op} #{last}")
        return where

    def absent(self) -> str:
        """Who has not entered this rank's newest call, in the timeout's words ("" if all
        have): what a kernel that waits for a peer's signal is most likely missing."""
        n = self.last_published
        missing = [r for r in self.peers if self._published(r) < n]
        if not n or not missing:
            return ""
        return (f"{_ranks_str(missing)} did not enter "
                f"{self._read(self.rank, n).op} #{n} ({'; '.join(self._where(missing))})")

    def _timeout(self, n: int, sig: Signature, missing: list[int], what: str) -> None:
        where = self._where(missing)
        raise CollectiveTimeoutError(
            f"{sig.op} #{n} on rank {self.rank}: {_ranks_str(missing)} did not {what} "
            f"within the {limit(self.timeout):g} s timeout ({'; '.join(where)}). A collective "
            f"must be called by every rank, in the same order; check for a rank-dependent "
            f"branch around it, or raise the limit with commlab.init(timeout=...) (a "
            f"torch.distributed group: its timeout)"
        )

    def _compare(self, n: int, mine: Signature, raw: bytes) -> None:
        sigs = [mine if r == self.rank else self._read(r, n) for r in range(self.world_size)]
        if _CUT in raw or any("cut" in s.hints for s in sigs):
            # compare what every encoding holds whole; the digests decide the rest
            sigs = [Signature.decode(raw) if r == self.rank else s for r, s in enumerate(sigs)]
        errors = [(r, s.error) for r, s in enumerate(sigs) if s.error]
        if errors:
            groups: dict[str, list[int]] = {}
            for r, e in errors:
                groups.setdefault(e.removeprefix(f"{mine.op}: "), []).append(r)
            if len(errors) == self.world_size and len(groups) == 1:  # nothing mismatched
                raise CommlabUsageError(f"{mine.op}: {next(iter(groups))}")
            text = "; ".join(f"on {_ranks_str(rs)}: {e}" for e, rs in groups.items())
            raise RankMismatchError(f"{mine.op}: {text}")
        ops = {s.op for s in sigs}
        if len(ops) > 1:
            by = ", ".join(f"rank {r}: {s.op}" for r, s in enumerate(sigs))
            raise RankMismatchError(
                f"collective #{n}: ranks called different collectives ({by}); every rank must "
                f"call the same collectives in the same order"
            )
        cut = any("cut" in s.hints for s in sigs)
        for key in mine.fields:
            if cut and any(key not in s.fields for s in sigs):
                continue  # cut off on some rank: the digest below covers it
            vals = [str(mine.fields[key]) if r == self.rank else s.fields.get(key, "?")
                    for r, s in enumerate(sigs)]
            if len(set(vals)) > 1:
                by_value: dict[str, list[int]] = {}
                for r, v in enumerate(vals):
                    by_value.setdefault(v, []).append(r)
                shown = ", ".join(f"{_ranks_str(rs)}: {v}" for v, rs in by_value.items())
                fix = mine.hints.get(key, f"pass the same {key} on every rank")
                raise RankMismatchError(f"{mine.op}: {key} differs across ranks ({shown}); {fix}")
        # every whole field agrees, yet the encodings differ: in a part too long to show
        raws = [raw if r == self.rank else self._raw(r, n) for r in range(self.world_size)]
        groups = {}
        for r, b in enumerate(raws):
            groups.setdefault(b[-2 * _DIGEST:].decode(errors="replace"), []).append(r)
        long = [k for k, v in mine.fields.items() if len(str(v)) > 64] or list(mine.fields)
        shown = ", ".join(f"{_ranks_str(rs)}: digest {d[:8]}" for d, rs in groups.items())
        raise RankMismatchError(
            f"{mine.op}: arguments differ across ranks in a field too long for the "
            f"agreement slot to show ({', '.join(long)}; {shown}); pass the same "
            f"{', '.join(long)} on every rank (compare them with a print on each rank)")

    def reset(self) -> None:
        """Forget the sequence (all ranks call this together, e.g. after a recovery)."""
        for s in range(RING):
            _HDR.pack_into(self.buf, self._slot(self.rank, s), 0, 0, 0)
        self._mine = [None] * RING
        self.set_checked(0)
        self.ahead.reset()
        self.seq = 0


