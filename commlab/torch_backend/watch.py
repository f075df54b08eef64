"""``commlab.watch()``: the communication/compute ratio of a training loop, step by step,
with a warning that names a cause it measured.

    w = commlab.watch()                         # on every rank, once the world exists
    for x, y in data:
        with w.step():
            loss_fn(model(x), y).backward(); opt.step()
    w.history, w.alerts                         # StepStats per step, the warnings raised

Each step is recorded with ``commlab.trace``: a "dist" span around every call through the
"commlab" torch.distributed backend (waiting for late ranks included) and commlab's own
"comm" spans (the kernels, with the bytes they moved). comm = ∪ dist spans (∪ comm spans
where nothing went through the backend), compute = step − comm. After each step the
ranks all-gather their five numbers over the Communicator's gloo group (one small
exchange), so every rank sees the same world and decides the same. The median ratio of
the first ``baseline`` steps is the baseline; a step whose ratio (the worst rank's) rises
above ``factor`` × baseline raises ``CommRatioWarning`` with the first cause that holds:

- a late rank: the kernels' arrival records name the rank that entered last in most
  of the step's calls and how late (``trace.arrivals``);
- a straggling rank: its compute exceeds the others' median by ``straggler`` × (they
  wait for it inside the collectives);
- a slow link: the kernels' bandwidth (bytes / kernel time) fell below 1/``factor`` of
  the baseline's; with ``topology=`` the slowest recorded edge between the ranks'
  devices is named with its measured GB/s;
- more data per step (bytes rose by ``factor``), else none measured.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from commlab import trace
from commlab.runtime import records
from commlab.trace import arrivals
from commlab.trace.overlap import merge, total

FIELDS = ("step_us", "comm_us", "kernel_us", "compute_us", "bytes")


class CommRatioWarning(UserWarning):
    """The comm/compute ratio rose well above its baseline (the message says why)."""


@dataclass
class StepStats:
    step: int
    ratio: float  # the worst rank's comm / compute
    per_rank: list[dict]  # FIELDS per rank
    alert: str = ""
    straggler: dict | None = None  # from the arrival records (trace.arrivals.straggler)

    def to_dict(self) -> dict:
        return asdict(self)


class Watch:
    def __init__(self, *, baseline: int = 3, factor: float = 2.0, straggler: float = 1.5,
                 topology=None, verbose: bool = True, comm=None):
        from commlab.runtime import init

        self.comm = comm or init()
        self.baseline_steps, self.factor, self.straggler = baseline, factor, straggler
        self.topology, self.verbose = topology, verbose
        self.history: list[StepStats] = []
        self.alerts: list[str] = []
        self.spans: list = []  # the last step's spans (for a timeline)
        self.arrivals: list = []  # the last step's call records (runtime.records)

    # -- measuring --------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self):
        """Record one training step (every rank, the same steps)."""
        book = records.book(self.comm)
        seen = 0
        if book is not None:
            book.collect()
            seen = book.seen
        trace.start(self.comm.rank)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.comm.synchronize()
            step_us = (time.perf_counter() - t0) * 1e6
            self.spans = trace.stop()
            self._record(step_us, self.spans, book, seen)

    def _record(self, step_us: float, spans, book=None, seen: int = 0) -> None:
        dist_iv = merge((s.start_us, s.end_us) for s in spans if s.kind == "dist")
        kern = [s for s in spans if s.kind == "comm"]
        kernel_us = total(merge((s.start_us, s.end_us) for s in kern))
        comm_us = total(dist_iv) if dist_iv else kernel_us
        mine = torch.tensor([step_us, comm_us, kernel_us, max(step_us - comm_us, 1e-3),
                             float(sum(s.bytes for s in kern))], dtype=torch.float64)
        world = torch.empty(self.comm.world_size * len(FIELDS), dtype=torch.float64)
        dist.all_gather_into_tensor(world, mine, group=self.comm.cpu_group)
        rows = [dict(zip(FIELDS, r.tolist(), strict=True))
                for r in world.view(self.comm.world_size, len(FIELDS))]
        # the step's call records, read after that exchange: every rank entered it once
        # its own kernels had ended, so each rank reads every call's record complete
        # (read before it, a peer's end stamp of the last call could be missing on one
        # rank and not another, and their straggler texts differed)
        self.arrivals = []
        if book is not None:
            book.collect()
            self.arrivals = book.since(seen, book.KEEP)
        ratio = max(r["comm_us"] / r["compute_us"] for r in rows)
        st = StepStats(len(self.history), ratio, rows,
                       straggler=arrivals.straggler(self.arrivals))
        base = self.baseline()
        if base is not None and ratio > self.factor * base:
            st.alert = self._cause(st, base)
            self.alerts.append(st.alert)
            warnings.warn(CommRatioWarning(st.alert), stacklevel=3)
        self.history.append(st)
        if self.verbose and self.comm.rank == 0:
            print(self.line(st), flush=True)

    # -- deciding -----------------------------------------------------------------------
    def baseline(self) -> float | None:
        """The median ratio of the first ``baseline`` steps (None until there are)."""
        if len(self.history) < self.baseline_steps:
            return None
        return statistics.median(s.ratio for s in self.history[: self.baseline_steps])

    def _base_median(self, key: str) -> float:
        return statistics.median(statistics.median(r[key] for r in s.per_rank)
                                 for s in self.history[: self.baseline_steps])

    def _cause(self, st: StepStats, base: float) -> str:
        head = (f"step {st.step}: communication takes {st.ratio:.2f}x the compute time, "
                f"{st.ratio / base:.1f}x the baseline {base:.2f}")
        late = st.straggler
        if late is not None and late["share"] >= 0.5 and late["late_ms"] * 1e3 > (
                0.1 * statistics.median(r["comm_us"] for r in st.per_rank)):
            return (f"{head}: rank {late['rank']} arrived last in {late['share']:.0%} of "
                    f"{late['op']} calls, {late['late_ms']:.3g} ms late on average (the "
                    f"kernels' arrival records); look at what rank {late['rank']} does "
                    f"differently (data loading, a busy core or GPU)")
        computes = [r["compute_us"] for r in st.per_rank]
        slow = max(range(len(computes)), key=computes.__getitem__)
        others = [c for i, c in enumerate(computes) if i != slow]
        if others and computes[slow] > self.straggler * statistics.median(others):
            return (f"{head}: rank {slow} is straggling (compute {computes[slow] / 1e3:.1f} ms "
                    f"against {statistics.median(others) / 1e3:.1f} ms on the others, which "
                    f"wait for it inside the collectives); look at what rank {slow} does "
                    f"differently (data loading, a busy core or GPU)")
        gbps = _gbps(st.per_rank)
        base_gbps = statistics.median(_gbps(s.per_rank) for s in
                                      self.history[: self.baseline_steps])
        if base_gbps and gbps < base_gbps / self.factor:
            return (f"{head}: the collectives themselves slowed down ({gbps:.3g} GB/s "
                    f"against {base_gbps:.3g} GB/s in the baseline steps){self._link_text()}")
        nbytes = statistics.median(r["bytes"] for r in st.per_rank)
        if nbytes > self.factor * max(self._base_median("bytes"), 1.0):
            return (f"{head}: each step moves more data ({nbytes / 1e6:.2f} MB against "
                    f"{self._base_median('bytes') / 1e6:.2f} MB); larger buckets or fewer "
                    f"parameters to synchronise")
        return f"{head}: no cause measured (no straggler, link speed and bytes as before)"

    def _link_text(self) -> str:
        topo = self.topology
        if topo is None:
            return "; pass topology= (commlab.topology.discover()) to name the link"
        devs = [topo.ranks.get(r) for r in range(self.comm.world_size)]
        edges = [topo.edge(a, b) for i, a in enumerate(devs) for b in devs[i + 1:]
                 if a and b]
        edges = [e for e in edges if e is not None]
        if not edges:
            return "; the topology has no edge between the ranks' devices"
        e = min(edges, key=lambda e: e.measured_gbps or e.peak_gbps or float("inf"))
        gb = e.measured_gbps or e.peak_gbps
        how = "measured" if e.measured_gbps else "peak"
        return (f"; the slowest link between the ranks in the recorded topology is "
                f"{e.a}-{e.b} ({e.kind} {e.path}, {gb:.3g} GB/s {how}): check it "
                f"(%linkbench) against that figure")

    # -- showing ------------------------------------------------------------------------
    def line(self, st: StepStats) -> str:
        """The step's worst ratio with its rank and a bar, then every rank's ratio."""
        base = self.baseline()
        ratios = rank_ratios(st.per_rank)
        worst = max(range(len(ratios)), key=ratios.__getitem__) if ratios else 0
        bar = "#" * min(40, int(round(st.ratio * 20)))
        b = f" baseline {base:.2f}" if base is not None else " (baseline steps)"
        each = "  ".join(f"r{r} {x:.2f}" for r, x in enumerate(ratios))
        late = st.straggler
        last = (f"\n  arrived last: rank {late['rank']} in {late['share']:.0%} of "
                f"{late['op']} calls, {late['late_ms']:.3g} ms late" if late else "")
        return (f"step {st.step:3d}  comm/compute {st.ratio:5.2f} (worst: rank {worst}){b}  "
                f"{bar}\n  per rank: {each}{last}" + (f"\n  ! {st.alert}" if st.alert else ""))

    def figure(self):
        """A plotly figure of the ratio per step, the baseline and the warning level."""
        return ratio_figure([s.to_dict() for s in self.history], self.baseline(), self.factor)


def ratio_figure(history: list[dict], baseline: float | None, factor: float):
    """The watch's plot from plain data (``StepStats.to_dict()`` per step), so a notebook
    can draw what it pulled from the ranks."""
    import plotly.graph_objects as go

    fig = go.Figure()
    steps = [h["step"] for h in history]
    ranks = max((len(h.get("per_rank") or []) for h in history), default=0)
    for r in range(ranks):  # every rank, thin, under the worst rank's line
        ys = [rank_ratios(h["per_rank"])[r] if r < len(h.get("per_rank") or []) else None
              for h in history]
        fig.add_scatter(x=steps, y=ys, mode="lines", name=f"rank {r}",
                        line={"width": 1, "dash": "dot"}, opacity=0.7)
    fig.add_scatter(x=steps, y=[h["ratio"] for h in history],
                    mode="lines+markers", name="comm / compute (worst rank)",
                    text=[h["alert"] for h in history], hoverinfo="x+y+text")
    if baseline is not None:
        fig.add_hline(y=baseline, line_dash="dash", line_color="gray",
                      annotation_text="baseline")
        fig.add_hline(y=factor * baseline, line_dash="dot", line_color="red",
                      annotation_text=f"{factor:g}x: warn")
    for h in history:
        if h["alert"]:
            fig.add_annotation(x=h["step"], y=h["ratio"], text="!", showarrow=False,
                               font={"color": "red", "size": 18}, yshift=12)
    fig.update_layout(height=300, margin={"t": 30}, xaxis_title="step",
                      yaxis_title="comm / compute")
    return fig


def rank_ratios(rows: list[dict]) -> list[float]:
    """comm / compute of each rank of one step (``StepStats.per_rank``)."""
    return [r["comm_us"] / r["compute_us"] if r["compute_us"] > 0 else 0.0 for r in rows]


def _gbps(rows: list[dict]) -> float:
    k = statistics.median(r["kernel_us"] for r in rows)
    return statistics.median(r["bytes"] for r in rows) / (k * 1e3) if k > 0 else 0.0


def watch(**kwargs) -> Watch:
    """Follow a training loop's comm/compute ratio (see the module docstring)."""
    return Watch(**kwargs)
