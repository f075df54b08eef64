"""Overlap metrics per rank, from spans.

Definitions (HTA's, over a rank's timeline; intervals are merged first, so nested or
parallel spans of one kind count once):

    comm        = ∪ comm spans           compute = ∪ compute spans
    overlap     = |comm ∩ compute| / |comm|        (1.0: all communication hidden)
    exposed     = |comm| − |comm ∩ compute|        (communication nothing hides)
    ratio       = |comm| / |compute|               (warn above a threshold you choose)

Kinds: "comm", and the tile roles "copy" and "wait", are communication; "compute" and
"reduce" are compute. Anything else (e.g. "memcpy", "other") is neither.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

COMM_KINDS = frozenset({"comm", "copy", "wait"})
COMPUTE_KINDS = frozenset({"compute", "reduce"})


def merge(intervals) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of (start, end) intervals."""
    out: list[list[float]] = []
    for s, e in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(merged) -> float:
    return sum(e - s for s, e in merged)


def intersect(a, b) -> list[tuple[float, float]]:
    """Intersection of two merged interval lists."""
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass
class OverlapMetrics:
    rank: int
    comm_us: float
    compute_us: float
    overlap_us: float
    exposed_comm_us: float
    overlap_ratio: float | None  # None when there is no communication
    comm_compute_ratio: float | None  # None when there is no compute
    span_us: float  # first start to last end

    def to_dict(self) -> dict:
        return asdict(self)


def _field(s, name):
    return s[name] if isinstance(s, dict) else getattr(s, name)


def overlap_metrics(spans, *, comm_kinds=COMM_KINDS, compute_kinds=COMPUTE_KINDS
                    ) -> dict[int, OverlapMetrics]:
    """Metrics per rank from Span objects or dicts (Span.to_dict() with "rank")."""
    by_rank: dict[int, list] = {}
    for s in spans:
        by_rank.setdefault(int(_field(s, "rank")), []).append(s)
    out = {}
    for r, ss in sorted(by_rank.items()):
        comm = merge((_field(s, "start_us"), _field(s, "end_us")) for s in ss
                     if _field(s, "kind") in comm_kinds)
        comp = merge((_field(s, "start_us"), _field(s, "end_us")) for s in ss
                     if _field(s, "kind") in compute_kinds)
        c, k = total(comm), total(comp)
        ov = total(intersect(comm, comp))
        lo = min(_field(s, "start_us") for s in ss)
        hi = max(_field(s, "end_us") for s in ss)
        out[r] = OverlapMetrics(r, c, k, ov, c - ov, ov / c if c > 0 else None,
                                c / k if k > 0 else None, hi - lo)
    return out


def fmt_time(us: float) -> str:
    """12.3 -> '12 µs'; 12345 -> '12.3 ms'; 2.5e6 -> '2.50 s' (thousands separated)."""
    if us < 1e3:
        return f"{us:,.0f} µs"
    if us < 1e6:
        return f"{us / 1e3:,.1f} ms"
    return f"{us / 1e6:,.2f} s"


def ratio_warnings(metrics: dict[int, OverlapMetrics], threshold: float) -> list[str]:
    """One short line per rank whose comm/compute time ratio is above ``threshold``."""
    out = []
    for r, m in sorted(metrics.items()):
        if m.comm_compute_ratio is not None and m.comm_compute_ratio > threshold:
            out.append(f"rank {r}: comm {m.comm_compute_ratio:,.1f}x compute "
                       f"({fmt_time(m.comm_us)} vs {fmt_time(m.compute_us)}, "
                       f"{fmt_time(m.exposed_comm_us)} exposed)")
        elif m.comm_compute_ratio is None and m.comm_us > 0:
            out.append(f"rank {r}: {fmt_time(m.comm_us)} of comm and no compute spans "
                       f"(mark compute with commlab.trace.span)")
    return out
