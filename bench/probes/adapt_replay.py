"""Replay one phase of a saved adapt_bench record through online selection's rules.

    python bench/probes/adapt_replay.py bench/results/adapt-cpu-w4-devicehost-9ccdcd7-r3.json stale

Feeds the phase's adaptive calls, in order, to a fresh key of today's rules
(``_adapt_rules``) and prints what ``judge`` says at each decision the run made, beside
what the run held. The costs are rank 0's host times (the record keeps no call records),
so a replay approximates the readings the run made; the record numbers leave a gap at each
block break for the fixed calls between. A block's first call follows other calls and a
barrier: it counts as a change when it ran another algorithm than the call before it, as
``_adapt.feed`` counts it.
"""

from __future__ import annotations

import argparse
import json
from collections import deque

from commlab.collectives import _adapt_rules as R
from commlab.collectives._adapt import _SINCE_MAX


def replay(phase: dict, algorithms=("one_shot", "two_shot", "ring")) -> list[tuple]:
    """(call index, judged current, burst, why, ratios, hint, held in the run) per decision."""
    t, ran, held = phase["adaptive_times_us"], phase["adaptive_ran"], phase["adaptive_choice"]
    decided = phase["adaptive_decided"]
    starts = set(phase.get("adaptive_starts") or range(0, len(t), phase["block"]))
    k = R.Key(tuple(algorithms), held[0], phase["table"], 1)
    record, since, out = 0, 0, []
    for i, alg in enumerate(ran):
        k.calls = i + 1
        record += 1 + (60 if i in starts else 0)  # the fixed blocks' records between
        since = 0 if i == 0 or alg != ran[i - 1] else min(since + 1, _SINCE_MAX)
        k.samples.setdefault(alg, deque(maxlen=R.PERIOD)).append(
            (i + 1, record, int(t[i] * 1000), since))
        if decided[i] and (i + 1) % R.PERIOD == 0:
            k.current = held[i - 1] if i else k.current
            cur, burst, why = R.judge(k)
            out.append((i, cur, burst, why, {a: round(r, 3) for a, r in k.ratio.items()},
                        k.hint, held[i]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("record", help="an adapt_bench JSON record")
    ap.add_argument("phase", help="small, large, load or stale")
    a = ap.parse_args(argv)
    phases = [p for p in json.load(open(a.record))["phases"] if p["phase"] == a.phase]
    if not phases:
        raise SystemExit(f"{a.record} has no phase {a.phase!r}")
    for i, cur, burst, why, ratios, hint, held in replay(phases[0]):
        print(f"call {i + 1}: judge -> {cur}{' + burst' if burst else ''} {why} | ratios "
              f"{ratios} hint {hint or '-'} | the run held {held}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
