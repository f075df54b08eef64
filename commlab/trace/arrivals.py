"""The late rank, named from the kernels' own arrival records (``runtime.records``).

A wall-clock view cannot tell the late rank from the ranks waiting for it: every rank
spends the same time inside the collective. The records can: each rank's kernel stamps
its entry, so the rank whose entry is latest is the one the others waited for.

    summary = straggler(records)      # {"rank", "share", "late_ms", "op", "calls"} or None
    straggler_text(records)           # "rank 3 arrived last in 92% of all_reduce calls,
                                      #  4.1 ms late on average"
    arrival_spans(records)            # per rank: "wait" (entry -> last entry), "comm"
"""

from __future__ import annotations

import statistics
from collections import Counter

from commlab.runtime.records import CallRecord
from commlab.trace._recorder import Span


def straggler(records: list[CallRecord], op: str | None = None) -> dict | None:
    """The rank most often last among ``records`` (of ``op``, else the commonest op),
    how often, and by how much on average (ms); None without records of 2+ ranks."""
    recs = [r for r in records if r.world > 1 and (op is None or r.op == op)]
    if not recs:
        return None
    if op is None:
        op = Counter(r.op for r in recs).most_common(1)[0][0]
        recs = [r for r in recs if r.op == op]
    lasts = Counter(r.last_rank for r in recs)
    rank, n = lasts.most_common(1)[0]
    late = [r.late_ns for r in recs if r.last_rank == rank]
    return {"rank": rank, "share": n / len(recs), "late_ms": statistics.fmean(late) / 1e6,
            "op": op, "calls": len(recs)}


def straggler_text(records: list[CallRecord], op: str | None = None) -> str:
    s = straggler(records, op)
    if s is None:
        return "no call records of two or more ranks"
    return (f"rank {s['rank']} arrived last in {s['share']:.0%} of {s['op']} calls, "
            f"{s['late_ms']:.3g} ms late on average ({s['calls']} calls)")


def arrival_spans(records: list[CallRecord], t0_ns: int | None = None) -> list[Span]:
    """Each call on each rank: a "wait" span from its entry to the last rank's entry and
    a "comm" span from there to its end, in µs since ``t0_ns`` (default: the first
    entry); the timeline draws them, ``to_chrome_trace`` exports them."""
    if not records:
        return []
    if t0_ns is None:
        t0_ns = min(min(r.entry) for r in records)
    out = []
    for r in records:
        last = max(r.entry)
        for rank in range(r.world):
            meta = {"call": r.call, "last_rank": r.last_rank}
            if r.entry[rank] < last:
                out.append(Span(r.op, "wait", rank, (r.entry[rank] - t0_ns) / 1e3,
                                (last - t0_ns) / 1e3, 0, r.algorithm, "arrival", meta))
            out.append(Span(r.op, "comm", rank, (last - t0_ns) / 1e3,
                            (max(r.end[rank], last) - t0_ns) / 1e3, r.nbytes, r.algorithm,
                            "stream", meta))
    return out
