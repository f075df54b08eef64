"""Comparing accesses: conflicts (overlapping bytes, one a write) not ordered by
happens-before, and the message that names both and the ordering that is missing.

A rank compares the accesses of its finished launch with every access in the shared
logs (its own other programs included). Whichever of two racing accesses is checked
later sees the other, so every pair is compared at least once whatever the timing;
records from before a host synchronisation that every rank has passed are dropped.
"""

from __future__ import annotations

from commlab.racecheck import _clock, _where


def refresh(chk) -> None:
    """Pull the peers' new access records (our own are compared as they are made)."""
    for r, log in enumerate(chk.shared.acc):
        if r != chk.rank:
            chk.records.setdefault(r, []).extend(log.refresh())


def forget_before(chk, seq) -> None:
    """Every rank passed host synchronisation ``seq``: what came before it is compared."""
    refresh(chk)
    for recs in chk.records.values():
        for i in range(len(recs) - 1, -1, -1):
            if recs[i][0] == "sync" and recs[i][1] == seq:
                del recs[: i + 1]
                break


def _ordered(a, b) -> bool:
    """a happens-before b, or b before a."""
    return _clock.covers(b[8], a[6], a[7]) or _clock.covers(a[8], b[6], b[7])


def find(chk, mine: list):
    """The first unreported race between ``mine`` and every known record, or None."""
    everyone = [x for recs in chk.records.values() for x in recs if x[0] != "sync"]
    for a in mine:
        for b in everyone + mine:
            if b is a or a[6] == b[6] or a[0] != b[0]:
                continue  # the same program is ordered by program order
            if not (a[3] or b[3]) or a[1] >= b[2] or b[1] >= a[2]:
                continue
            if _ordered(a, b):
                continue
            key = tuple(sorted((_ident(a), _ident(b))))
            if key in chk.reported:
                continue
            chk.reported.add(key)
            return (a, b) if _ident(a) > _ident(b) else (b, a)
    return None


def _ident(r):
    return (r[10][0], r[4], str(r[5]), r[1], r[9])


def _who(r) -> str:
    pid = r[5]
    prog = pid[0] if pid[1] == 0 and pid[2] == 0 else pid
    return f"rank {r[4]} program {prog} ({r[10][1]}, {r[9]})"


def message(chk, first, later) -> str:
    """``first`` ran before ``later`` in this run; neither is ordered after the other."""
    lo, hi = max(first[1], later[1]), min(first[2], later[2])
    what = _where.region(chk.comm.heap, first[0], lo, hi)
    verb = {True: "stored to", False: "loaded"}
    # like ThreadSanitizer's: each access on its own line, then the missing order
    head = (f"data race on {what}:\n"
            f"  {_who(first)} {verb[first[3]]} it\n"
            f"  {_who(later)} {verb[later[3]]} it\n"
            f"with no happens-before between them. ")
    if first[4] == later[4] and first[10][0] == later[10][0]:
        p, q = sorted((first[5][0], later[5][0]))
        why = (f"Programs {p} and {q} of one launch run concurrently "
               f"(as on a GPU, in any order): order "
               f"them with a cl.notify/cl.wait pair, or put the second access in a later "
               f"launch.")
    else:
        writes = [x for x in (first, later) if x[3]]
        if len(writes) == 2:
            w, o = later, first
            why = (f"neither store is ordered after the other: rank {w[4]} stored before any "
                   f"wait that follows rank {o[4]}'s notify after its store at {o[9]}.")
        else:
            o, w = writes[0], first if writes[0] is later else later
            if w[11] == 0:  # the loading program had not completed a wait in its launch
                why = (f"rank {w[4]} loaded it before any wait that follows rank {o[4]}'s "
                       f"notify: rank {o[4]} should cl.notify after its store at {o[9]} and "
                       f"rank {w[4]} cl.wait for that value before loading.")
            else:
                why = (f"rank {w[4]} loaded it before any wait that follows rank {o[4]}'s "
                       f"notify after that store (its wait saw an earlier signal, or a value "
                       f"already there), and rank {o[4]} stored it before any wait that "
                       f"follows rank {w[4]}'s notify after that load: wait for a value "
                       f"only this round's signal makes, and reuse a buffer only after the "
                       f"reader said it is done.")
    return head + why
