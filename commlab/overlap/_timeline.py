"""The tile timeline: a trace buffer for the kernels' stamps (``_tiles.stamp``) and its
decoding into trace spans on "sm N" (GPU) or "program N" (CPU) lanes."""

from __future__ import annotations

import torch

from commlab.overlap import _launch, _tiles
from commlab.runtime import Communicator
from commlab.trace._recorder import RECORDER, Span


def trace_buffer(comm: Communicator, rows: int) -> torch.Tensor | None:
    """A [rows, 6] int64 buffer when a trace is recording, else None (columns:
    ``_tiles.stamp``)."""
    if not RECORDER.active:
        return None
    return torch.zeros((max(rows, 1), 6), dtype=torch.int64, device=comm.device)


class Clock:
    """Maps a launch's tile clock (ns) onto the recorder's time axis (us)."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.mark = RECORDER._stamp(comm.device)  # CPU: host ns; CUDA: an event

    def origin_us(self, tile_t0_ns: int) -> tuple[float, int]:
        """(where the launch starts on the recorder's axis, the tile clock there)."""
        if isinstance(self.mark, int):
            return (self.mark - RECORDER._t0_ns) / 1e3, self.mark
        torch.cuda.synchronize(self.comm.device)
        t0 = RECORDER._t0_event
        assert t0 is not None  # self.mark is a CUDA stamp, and the first one set it
        return t0.elapsed_time(self.mark) * 1e3, tile_t0_ns


def add_tile_spans(comm: Communicator, trace: torch.Tensor, clock: Clock, op: str,
                   roles_of) -> None:
    """Decode ``trace`` ([rows, 6]: four stamps, the lane, the tile) into one Span per
    role; rows never stamped are skipped.

    ``roles_of(tile)`` names the roles between consecutive stamps, e.g.
    ("wait", "compute") for a tile stamped at columns 0, 1, 2 (None: no span). A tile
    computed in parts (a split tail) has one row per part: their spans share the tile."""
    clock_kind = _launch.trace_clock(comm)
    if clock_kind == _tiles.CLOCK_NONE:  # the target has no clock the kernels can read
        at = (RECORDER._stamp(None) - RECORDER._t0_ns) / 1e3
        RECORDER.add(Span(name=f"{op}:no tile stamps", kind="note", rank=comm.rank,
                          start_us=at, end_us=at, meta={
                              "op": op, "why": "no device clock on this target "
                              f"({_launch.current_target(comm)}): tiles are not stamped"}))
        return
    rows = trace.cpu().tolist()
    started = [r[0] for r in rows if r[0]]
    if not started:
        return
    base_us, base_ns = clock.origin_us(min(started))
    lane_word = "sm" if comm.backend != "cpu" and clock_kind == _tiles.CLOCK_PTX else "program"
    for r in rows:
        if not r[0]:
            continue
        tile = r[5]
        roles = roles_of(tile)
        for i, role in enumerate(roles):
            t0, t1 = r[i], r[i + 1]
            if role is None or not (t0 and t1):
                continue
            RECORDER.add(Span(
                name=f"{op}:{role}", kind=role, rank=comm.rank,
                start_us=base_us + (t0 - base_ns) / 1e3, end_us=base_us + (t1 - base_ns) / 1e3,
                lane=f"{lane_word} {r[4]}", meta={"op": op, "tile": tile},
            ))
