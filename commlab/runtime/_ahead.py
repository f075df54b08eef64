"""Agreement without a host barrier: a repeated call publishes, launches, is checked later.

A waiting agreement (``ControlBlock.agree``) holds every call until every rank's host has
arrived, so the host cannot run ahead of the GPU. A call skips that wait when

- the collectives hold a cached plan for it (made by a call every rank agreed on), and
- its signature is byte-identical to this rank's previous call, which passed.

It then publishes its signature marked "ahead", launches and returns; the peers'
signatures of that call are compared at this rank's next call (those published by then)
and all of them at ``synchronize()``, ``barrier()``, an allocation, any call that
waits, or the end of a ``%%distributed`` cell (``commlab.engine._cell``). A call waits
as before on the first call of a plan, on a plan change (any other call in between,
allocation included), under ``racecheck`` and when the ring is full: ``RING`` calls
unchecked here, or a peer has not yet checked the call whose slot it would overwrite.
``COMMLAB_AGREE_AHEAD=0`` makes every call wait.

Why a late check is safe. Every rank that skips the wait at call n launches the same
kernel: its previous call's, and those agree (a rank that waited at n - 1 and passed saw
all signatures equal; ranks that all skipped at n - 1 agree by induction; a rank that
raised at n - 1 waits at n). That kernel is one every rank launched once with the same
sizes and offsets, so no mismatch in what decides memory can reach it. A rank that waits
at n and finds a mismatch first launches the skipping ranks' kernel itself
(:meth:`Ahead.drain`: the plan, on zeros), so their kernels complete and the device flags
stay in step; then it raises. The skipping ranks raise the same RankMismatchError (its
text is built from every rank's signature) when their check of n runs, at the latest at
their next call or synchronize after the peers made call n; then they wait again.

What a skipped wait gives up: a rank missing from a call its peers ran ahead is named
only by their next waiting check (the same CollectiveTimeoutError), while their kernel
already waits for it on the device (on CPU the interpreter's wait names a dead peer).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable

from commlab._interpreter.blocked import cell_place

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # commlab/
# (file, line) that called the public collective now running (set by the wrapper every
# public collective has, ``_publish``: one frame read, ~0.2 µs); a call from inside
# commlab (its file under commlab/) is not named
CALLER: list[tuple[str, int] | None] = [None]

# ControlBlock's helpers used here (one class split in two files, so private names):
# _wait (spin with the timeout), _raw (a peer's published encoding), _compare (raises),
# _lock (one thread inside the agreement). SYNC_HOOK is set by racecheck: calls wait then.
SYNC_HOOK: list = [None]  # fn(event, rank, seq), "publish" then "join": racecheck's clocks


class Ahead:
    """The calls of one ControlBlock that ran ahead, and which calls may."""

    def __init__(self, block, enabled: bool):
        self.block = block
        self.enabled = enabled
        self.last: bytes | None = None  # this rank's previous call, if it passed
        # (seq, Signature, raw, call site, digest) published, not yet checked
        self.pending: deque = deque()
        self.drains: dict[bytes, Callable[[], None]] = {}  # raw -> launch its kernel on zeros

    def allow(self, raw: bytes, drain: Callable[[], None]) -> None:
        """A call with encoding ``raw`` passed on every rank and has a cached plan;
        ``drain()`` launches that plan's kernel on zeros (for a peer that waits)."""
        self.drains[raw] = drain

    def may_skip(self, raw: bytes, n: int) -> bool:
        b = self.block
        return (self.enabled and raw == self.last and raw in self.drains
                and len(self.pending) < b.RING and b.ring_free(n))

    def publish(self, sig, raw: bytes) -> int:
        """Publish call ``n`` marked ahead and return ``n`` (the caller launches)."""
        b = self.block
        n = b.seq + 1
        # after ring_free: every peer published the calls it checked, so this checks up to
        # n - RING at least, and a peer waiting for our check is never left waiting
        self.poll()
        dig = b.publish(n, raw, ahead=True)
        b.seq = n
        self.pending.append((n, sig, raw, CALLER[0], dig))
        return n

    def repeat(self, rec) -> int:
        """The block's ``agree(rec.sig, rec.raw, ahead=True)`` for a plan's ``Record``: when
        the call may run ahead (``may_skip``) check what peers published (``poll``, inlined),
        publish the record (only the seq word when our slot holds it already) and return;
        else the waiting agreement."""
        b = self.block
        if not b._lock.acquire(blocking=False):
            return b.agree(rec.sig, rec.raw, ahead=True)  # raises the thread refusal
        try:
            n = b.seq + 1
            pending = self.pending
            skip = (SYNC_HOOK[0] is None and self.enabled and rec.raw == self.last
                    and len(pending) < b.RING and rec.raw in self.drains and b.ring_free(n))
            if skip:
                b.entered += 1
                words, stride, ring = b.words, b.RING * b.SLOT_WORDS, b.RING
                while pending:
                    m, dig = pending[0][0], pending[0][4]
                    slot = (m % ring) * b.SLOT_WORDS
                    ready = True
                    for r in b.peers:
                        if words[r * stride + slot] < m:
                            ready = False
                            break
                    if not ready:
                        break
                    if any(words[r * stride + slot + 2] != dig for r in b.peers):
                        self.poll()  # checks it in full: raises the mismatch, as peers do
                        continue
                    pending.popleft()
                    words[b.checked_word] = m
                b.publish_record(n, rec)
                b.seq = n
                pending.append((n, rec.sig, rec.raw, CALLER[0], rec.digest))
        except BaseException:
            self.last = None
            raise
        finally:
            b._lock.release()
        return n if skip else b.agree(rec.sig, rec.raw, ahead=True)

    def poll(self) -> None:
        """Check the pending calls every peer has published (no waiting)."""
        b = self.block
        while self.pending:
            n = self.pending[0][0]
            for r in b.peers:
                if not b.published(r, n):
                    return
            self._check()

    def settle(self) -> None:
        """Check every pending call, waiting for peers to publish them."""
        b = self.block
        while self.pending:
            n, sig = self.pending[0][:2]
            b._wait(n, sig, lambda r, n=n: b.published(r, n), "arrive")
            self._check()

    def _check(self) -> None:
        n, sig, raw, site, dig = self.pending.popleft()
        b = self.block
        b.set_checked(n)
        for r in b.peers:
            if b.digest_of(r, n) != dig:  # 64 bits of the encoding (_control.digest)
                try:
                    b._compare(n, sig, raw)  # raises the text every rank raises
                except Exception as e:
                    # raised here, at a later call or synchronize(): say where the call was
                    if site is not None and site[0].startswith(_OWN):
                        site = None  # called from inside commlab: no line of the user's
                    e.ran_ahead_at = site  # type: ignore[attr-defined]
                    where = "" if site is None else (
                        f", {cell_place(*site) or f'{site[0]}:{site[1]}'}")
                    e.add_note(f"rank {b.rank} made this call ({sig.op} #{n}{where}) without "
                               f"waiting, as a repeat of its previous call; it was checked "
                               f"here, later")
                    raise

    def drain(self, n: int) -> None:
        """Call ``n`` mismatched after this rank waited: if peers launched it ahead, launch
        their kernel here too (on zeros), so theirs completes; then the caller raises."""
        b = self.block
        ahead = [r for r in b.peers if b.went_ahead(r, n)]
        if ahead:
            fn = self.drains.get(b._raw(ahead[0], n))
            if fn is not None:
                fn()

    def reset(self) -> None:
        self.pending.clear()
        self.last = None

