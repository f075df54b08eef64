"""The call records' ring on the host: which records a collect takes, which it gives up
as lost (the ring went round), and which wait for a rank still running."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import commlab
from commlab.runtime import _native, records
from commlab.runtime.heap import RECORD_RING


def _rings(world: int, done: dict[int, list[int]], counter: int) -> np.ndarray:
    """[world, words] with records ``done`` (record number -> end per rank; 0: that rank
    has not finished it) and every rank's counter at ``counter``."""
    rings = np.zeros((world, records._WORDS), dtype=np.int64)
    rings[:, 0] = counter
    for k, ends in done.items():
        at = records._RING_AT + records._REC * ((k - 1) % RECORD_RING)
        for r, end in enumerate(ends):
            rings[r, at:at + 4] = [k, 100 * k + r, 100 * k + 50, end]
    return rings


def test_a_record_is_taken_once_every_rank_ended_it_and_given_up_once_overwritten():
    k = RECORD_RING + 3  # its slot is also record 3's
    rings = _rings(2, {k: [9, 9], k + 1: [9, 0]}, counter=k + 1)
    ks = range(2, k + 2)
    status, stamps = records._marks(*records._gather(*records._ring_views(list(rings)), ks),
                                    ks, brief=False)
    assert status[2 - 2] == status[3 - 2] == records.LOST  # their slots went round
    assert status[5 - 2] == records.WAITING  # within the ring, never written: waits
    assert status[k - 2] == records.READY
    assert status[k + 1 - 2] == records.WAITING  # rank 1 still runs record k + 1
    assert stamps[k - 2] == [[100 * k, 100 * k + 1], [100 * k + 50] * 2, [9, 9]]


def test_the_c_read_of_records_in_brief_gives_what_the_numpy_read_gives():
    fast = _native.module()
    if fast is None:
        pytest.skip("the C twin is not built here (COMMLAB_NATIVE=0 or no compiler)")
    rng = np.random.default_rng(0)
    for world in (1, 2, 4):
        count = 3 * RECORD_RING + 17
        done = {k: [int(v) for v in rng.integers(0, 3, world)]  # 0: that rank still runs it
                for k in range(count - RECORD_RING - 5, count + 1) if rng.random() < 0.9}
        words = list(_rings(world, done, counter=count))
        for ks in (range(count - 30, count + 1), range(count - RECORD_RING - 4, count + 2),
                   range(1, 40), range(count - RECORD_RING + 1, count - RECORD_RING + 2)):
            status, (firsts, lasts) = records._marks(
                *records._gather(*records._ring_views(words), ks), ks, brief=True)
            rings, counts = records._ring_views(words)
            got = fast.records_brief(tuple(r.ctypes.data for r in rings),
                                     tuple(c.ctypes.data for c in counts), ks[0], len(ks),
                                     RECORD_RING)
            assert (list(got[0]), got[1], got[2]) == (status, firsts, lasts), (world, ks)
            assert set(status) == {records.LOST, records.READY, records.WAITING} or len(ks) < 40


def _many_calls(comm):
    from commlab.runtime import records as rec

    x = torch.ones(64)
    book = rec.book(comm)
    for _ in range(RECORD_RING + 40):  # more calls than the ring keeps, none collected
        commlab.all_reduce(x, algorithm="one_shot")
    commlab.barrier()  # every rank's kernels ended: their records complete
    got = book.collect()
    return [r.call for r in got], book.mark(), len(book.pending)


def test_a_collect_after_more_calls_than_the_ring_keeps_takes_the_newest_in_order(world):
    for calls, mark, pending in world(_many_calls, 2):
        assert calls and calls[-1] <= mark and pending == 0
        assert calls == list(range(calls[0], calls[0] + len(calls)))  # one record a call here
        assert mark - calls[0] < RECORD_RING <= mark  # the older ones were given up


def _peeked(comm):
    from commlab.runtime import records as rec

    x = torch.ones(64)
    book = rec.book(comm)
    for _ in range(30):
        commlab.all_reduce(x, algorithm="one_shot")
    commlab.barrier()
    pending = len(book.pending)
    peeked = [r.call for r in book.peek(5)]
    since = [r.call for r in book.peek(100, after=peeked[2])]
    left = len(book.pending)
    collected = book.collect()
    again = book.peek(5)  # the collected calls, in brief
    return (peeked, since, pending, left, [r.call for r in collected][-5:],
            [(b.call, b.last_end) for b in again],
            [(r.call, r.last_end) for r in collected[-5:]])


def test_a_peek_reads_the_newest_records_and_leaves_them_to_the_next_collect(world):
    for peeked, since, before, after, collected, again, last in world(_peeked, 2):
        assert len(peeked) == 5 and peeked == list(range(peeked[0], peeked[0] + 5))
        assert since == peeked[2:]  # from a record number on, however many are asked
        assert before == after >= 30  # nothing collected by the peek
        assert collected == peeked  # the collect still hands them out
        assert again == last  # and a peek after it reads them from the collected


def _forgotten(comm):
    from commlab.runtime import records as rec

    x = torch.ones(64)
    book = rec.book(comm)
    book.collect()
    for _ in range(4):
        commlab.all_reduce(x, algorithm="one_shot")
    mark = book.mark()
    for _ in range(3):
        commlab.all_reduce(x, algorithm="two_shot")
    book.forget(mark)
    commlab.all_reduce(x, algorithm="one_shot")
    commlab.barrier()
    return [(r.call, r.algorithm) for r in book.collect()], mark


def test_forgotten_calls_are_never_handed_out_and_later_ones_still_are(world):
    for got, mark in world(_forgotten, 2):
        algs = [a for _, a in got]
        assert algs == ["one_shot"] * 5  # the 3 two-shot calls after the mark are gone
        assert [c for c, _ in got][-1] > mark + 3  # the call after them is still read
