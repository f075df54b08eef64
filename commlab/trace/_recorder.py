"""Span recording: commlab's collectives (kind "comm") and user-marked compute.

On CPU a span is two host-clock readings. On CUDA it is a pair of CUDA events on the
current stream, resolved to times only when the trace is collected, so recording never
synchronizes the device. Spans are kept only while a recording is active (``start()``),
so the cost when tracing is off is one attribute read.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class Span:
    name: str
    kind: str  # "comm" | "compute" | tile roles ("wait", "copy", "compute", "reduce")
    rank: int
    start_us: float
    end_us: float
    bytes: int = 0
    algorithm: str = ""
    lane: str = ""  # e.g. "stream" or "sm 12" / "program 3" for tile spans
    meta: dict = field(default_factory=dict)

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Span:
        """Inverse of ``to_dict`` (unknown keys go to ``meta``)."""
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        if extra:
            kw["meta"] = {**kw.get("meta", {}), **extra}
        return cls(**kw)


class Recorder:
    def __init__(self) -> None:
        self.active = False
        self.rank = 0
        self._pending: list = []  # (name, kind, bytes, algorithm, lane, meta, start, end)
        self._t0_event: torch.cuda.Event | None = None  # the first CUDA stamp
        self._t0_ns = 0

    def start(self, rank: int = 0) -> None:
        self.active = True
        self.rank = rank
        self._pending = []
        self._t0_ns = time.perf_counter_ns()
        self._t0_event = None

    def _stamp(self, device: torch.device | None):
        if device is not None and device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            if self._t0_event is None:
                self._t0_event = ev
            return ev
        return time.perf_counter_ns()

    @contextlib.contextmanager
    def span(self, name: str, kind: str = "compute", *, bytes: int = 0, algorithm: str = "",
             device: torch.device | None = None, lane: str = "stream", meta: dict | None = None):
        if not self.active:
            yield
            return
        if device is None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.device("cuda", torch.cuda.current_device())
        begin = self._stamp(device)
        try:
            yield
        finally:
            end = self._stamp(device)
            self._pending.append((name, kind, bytes, algorithm, lane, meta or {}, begin, end))

    def add(self, span: Span) -> None:
        """Add an already-timed span (e.g. a tile span decoded from a kernel's buffer)."""
        if self.active:
            self._pending.append(span)

    def stop(self) -> list[Span]:
        """End the recording and resolve every span to microseconds since ``start``."""
        self.active = False
        if self._t0_event is not None:
            torch.cuda.synchronize()
        out: list[Span] = []
        for item in self._pending:
            if isinstance(item, Span):
                out.append(item)
                continue
            name, kind, nbytes, algo, lane, meta, b, e = item
            if isinstance(b, int):
                s, t = (b - self._t0_ns) / 1e3, (e - self._t0_ns) / 1e3
            else:
                t0 = self._t0_event
                assert t0 is not None  # b is a CUDA stamp, and the first one set t0
                s, t = t0.elapsed_time(b) * 1e3, t0.elapsed_time(e) * 1e3
            out.append(Span(name, kind, self.rank, s, t, nbytes, algo, lane, meta))
        self._pending = []
        return out


RECORDER = Recorder()
