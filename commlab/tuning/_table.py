"""The tuning table: per (op, dtype, world size), the measured winner at each swept size.

A message of ``n`` bytes uses the winner of the nearest swept size on a log scale (the
boundary between swept sizes a < b is sqrt(a·b)); below the smallest or above the
largest swept size, the nearest end's winner. At every swept size ``auto`` therefore runs
exactly the algorithm that was fastest there when measured side by side.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = "commlab.tuning/1"


def winners(times: dict[int, dict[str, float]]) -> list[dict]:
    """{bytes: {algorithm: µs}} -> [{"bytes", "algorithm", "times_us"}] sorted by size,
    the algorithm being the fastest measured at that size."""
    rows = []
    for nbytes in sorted(times):
        t = {a: float(v) for a, v in times[nbytes].items() if v and v > 0}
        if t:
            rows.append({"bytes": int(nbytes), "algorithm": min(t, key=t.__getitem__),
                         "times_us": t})
    return rows


@dataclass
class TuningTable:
    fingerprint: str
    fields: dict
    entries: dict[str, list[dict]] = field(default_factory=dict)  # "op|dtype|world" -> rows
    meta: dict = field(default_factory=dict)

    @staticmethod
    def key(op: str, dtype: str, world_size: int) -> str:
        return f"{op}|{dtype}|{world_size}"

    def set(self, op: str, dtype: str, world_size: int, times: dict) -> None:
        self.entries[self.key(op, dtype, world_size)] = winners(times)

    def buckets(self, op: str, dtype: str, world_size: int, known=None):
        """(bounds, algorithms) for bisect, or None; rows naming an algorithm not in
        ``known`` (a table older than the code) are dropped."""
        rows = [r for r in self.entries.get(self.key(op, dtype, world_size), [])
                if known is None or r["algorithm"] in known]
        if not rows:
            return None
        sizes = [r["bytes"] for r in rows]
        bounds = [math.sqrt(a * b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        return bounds, [r["algorithm"] for r in rows]

    def choose(self, op: str, dtype: str, world_size: int, nbytes: int) -> str | None:
        b = self.buckets(op, dtype, world_size)
        return None if b is None else b[1][bisect_left(b[0], nbytes)]

    # -- files ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "fingerprint": self.fingerprint, "fields": self.fields,
                "meta": self.meta, "entries": self.entries}

    @classmethod
    def from_dict(cls, d: dict) -> TuningTable:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"tuning table schema {d.get('schema')!r} is not {SCHEMA!r}")
        return cls(d["fingerprint"], d["fields"], d.get("entries", {}), d.get("meta", {}))

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{id(self)}")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        tmp.replace(path)  # atomic: a reader never sees half a table
        return path

    @classmethod
    def load(cls, path) -> TuningTable:
        return cls.from_dict(json.loads(Path(path).read_text()))


def auto_violations(records, tolerance: float = 0.05, choice=None) -> list[str]:
    """Sizes where auto is more than ``tolerance`` slower than the best single commlab
    algorithm measured in the same run (records as from commlab.bench).

    ``choice(op, dtype, nbytes) -> algorithm`` (what auto runs, e.g. ``TuningTable.choose``
    for this world): auto is then judged by the measured time of the algorithm it picks.
    In CUDA-graph mode that is exact (auto's replay is that algorithm's kernels; its own
    measurement differs from them only by run-to-run noise, up to 1 µs at 5-20 µs on
    2xH200); in eager mode the lookup's host cost counts, so there auto's own time is used.
    Without ``choice``, auto's own measured time is used everywhere."""
    groups: dict[tuple, dict[str, float]] = {}
    for r in records:
        if r.impl.startswith("commlab:"):
            groups.setdefault((r.op, r.dtype, r.mode, r.bytes), {})[r.impl[8:]] = r.time_us
    out = []
    for (op, dtype, mode, nbytes), t in sorted(groups.items()):
        singles = {a: v for a, v in t.items() if a != "auto"}
        if "auto" not in t or not singles:
            continue
        best = min(singles, key=singles.__getitem__)
        picked = choice(op, dtype, nbytes) if choice is not None and mode == "graph" else None
        mine, label = ((singles[picked], f"auto (runs {picked})") if picked in singles
                       else (t["auto"], "auto"))
        if mine > singles[best] * (1 + tolerance):
            over = 100 * (mine / singles[best] - 1)
            out.append(f"{op} {dtype} {mode} {nbytes} B: {label} {mine:.1f} µs vs "
                       f"{best} {singles[best]:.1f} µs (+{over:.0f}%)")
    return out
