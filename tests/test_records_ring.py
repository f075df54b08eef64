"""The call records' ring on the host: which records a collect takes, which it gives up
as lost (the ring went round), and which wait for a rank still running."""

from __future__ import annotations

import numpy as np
import torch

import commlab
from commlab.runtime import records
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
    lost, ready, slots = records._slots(rings, np.arange(2, k + 2))
    stamps = slots[:, :, 1:].transpose(1, 2, 0).tolist()
    assert lost[2 - 2] and lost[3 - 2]  # their slots went round (record 3's holds k)
    assert not lost[5 - 2] and not ready[5 - 2]  # within the ring, never written: waits
    assert ready[k - 2] and not lost[k - 2]
    assert not ready[k + 1 - 2]  # rank 1 still runs record k + 1
    assert stamps[k - 2] == [[100 * k, 100 * k + 1], [100 * k + 50] * 2, [9, 9]]


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
