"""``LinkBenchResult``: the bandwidth matrix of a linkbench run, as plain data.

``gbps[method][size_index][i][j]`` is the bandwidth at which rank i read rank j's buffer.
``peak[i][j]`` is the link's peak (per direction, GB/s) or None when unknown; on the CPU
backend a shared-memory "link" is memory, so its peak is the reader's own local copy
bandwidth measured in the same run (the diagonal, largest size, memcpy).
In a world across hosts, ``hosts`` lists each host's ranks and ``cross_host[i][j]`` marks
the pairs on different hosts: measured with torch.distributed send/recv (the same figure
in every method), their peak unknown (None).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from commlab.topology._model import write_json

SCHEMA = "commlab.linkbench/1"


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


@dataclass
class LinkBenchResult:
    world_size: int
    backend: str
    sizes: list[int]
    methods: list[str]
    gbps: dict[str, list[list[list[float]]]]
    peak: list[list[float | None]] = field(default_factory=list)
    peak_source: str = ""
    device: str = ""
    meta: dict = field(default_factory=dict)
    hosts: list[list[int]] = field(default_factory=list)  # ranks per host ([] = one host)

    @property
    def cross_host(self) -> list[list[bool]]:
        """``[i][j]``: ranks i and j are on different hosts (measured with send/recv)."""
        host_of = {r: h for h, ranks in enumerate(self.hosts) for r in ranks}
        return [[host_of.get(i, 0) != host_of.get(j, 0) for j in range(self.world_size)]
                for i in range(self.world_size)]

    @classmethod
    def from_rows(cls, rows: list[dict], topology=None) -> LinkBenchResult:
        """Assemble each reader's row (``linkbench.rank_run``) into the full matrix."""
        rows = sorted(rows, key=lambda r: r["rank"])
        r0 = rows[0]
        w, methods, sizes = r0["world_size"], r0["methods"], r0["sizes"]
        gbps = {m: [[rows[i]["gbps"][m][si] for i in range(w)] for si in range(len(sizes))]
                for m in methods}
        hosts = [list(h) for h in r0.get("hosts", [])]
        res = cls(w, r0["backend"], sizes, methods, gbps, device=r0.get("device", ""),
                  hosts=hosts if len(hosts) > 1 else [])
        res.peak, res.peak_source = _peaks(res, topology)
        if res.hosts:
            res.meta["cross_host_method"] = (
                "torch.distributed send/recv after a 4-byte request, timed on the reader "
                "(gloo on CPU, NCCL on GPU); the same figure in every method")
            cross = res.cross_host
            res.peak = [[None if cross[i][j] else p for j, p in enumerate(row)]
                        for i, row in enumerate(res.peak)]
        return res

    # -- views ---------------------------------------------------------------------------
    def matrix(self, method: str | None = None, size: int | None = None) -> list[list[float]]:
        """GB/s, reader i (row) from source j (column), at ``size`` (default: largest)."""
        m = method or self.methods[0]
        return self.gbps[m][self._size_index(size)]

    def percent_of_peak(self, method=None, size=None) -> list[list[float | None]]:
        mat = self.matrix(method, size)
        unknown: list[list[float | None]] = [[None] * self.world_size] * len(mat)
        return [[(100.0 * v / p if p else None) for v, p in zip(row, prow, strict=True)]
                for row, prow in zip(mat, self.peak or unknown, strict=True)]

    def curve(self, i: int, j: int, method: str | None = None) -> list[float]:
        m = method or self.methods[0]
        return [self.gbps[m][si][i][j] for si in range(len(self.sizes))]

    def _size_index(self, size: int | None) -> int:
        if size is None:
            return len(self.sizes) - 1
        if size not in self.sizes:
            raise ValueError(f"size {size} was not measured; measured sizes: "
                             f"{', '.join(fmt_bytes(s) for s in self.sizes)}")
        return self.sizes.index(size)

    def table(self, method=None, size=None) -> str:
        """A text matrix, for terminals and logs."""
        mat = self.matrix(method, size)
        head = "reader\\src " + "".join(f"{j:>10}" for j in range(self.world_size))
        lines = [head] + [f"rank {i:<6}" + "".join(f"{v:>10.2f}" for v in row)
                          for i, row in enumerate(mat)]
        return "\n".join(lines)

    # -- persistence ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> LinkBenchResult:
        d = {k: v for k, v in d.items() if k != "schema"}
        return cls(**d)

    def save(self, path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> LinkBenchResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _peaks(res: LinkBenchResult, topology) -> tuple[list, str]:
    w = res.world_size
    if res.backend == "cpu" or topology is None:
        m = "memcpy" if "memcpy" in res.methods else res.methods[0]
        local = [res.gbps[m][-1][i][i] for i in range(w)]
        peak = [[local[i] if local[i] and not math.isnan(local[i]) else None for _ in range(w)]
                for i in range(w)]
        return peak, (f"shared memory is memory: each reader's own local copy bandwidth "
                      f"({m}, {fmt_bytes(res.sizes[-1])}, measured in this run)")
    peak = [[None] * w for _ in range(w)]
    for i in range(w):
        for j in range(w):
            a, b = topology.ranks.get(i), topology.ranks.get(j)
            if a and b and a != b:
                e = topology.edge(a, b)
                peak[i][j] = e.peak_gbps if e is not None and e.peak_gbps else None
    return peak, f"topology {topology.name!r}: edge peak_gbps (per direction)"
