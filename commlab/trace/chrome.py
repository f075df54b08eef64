"""Chrome trace JSON in and out: import PyTorch profiler traces, export for Perfetto.

Import: ``torch.profiler`` writes chrome-trace JSON (``prof.export_chrome_trace`` or
``tensorboard_trace_handler``); each complete event (``"ph": "X"``) becomes a Span.
GPU kernels are classified by name, as HTA and Nsight do: ``nccl*`` and ``commlab*``
(plus commlab's own collective kernels) are "comm", other kernels "compute", memcpy and
memset "memcpy". A trace with no GPU events (CPU-only runs) uses the CPU ops instead.

Export: one process per rank, one thread per lane, every span a complete event; open
the file in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from commlab.trace._recorder import Span

COMM_PATTERNS = (
    r"^nccl", r"^commlab",
    r"(all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|barrier)_kernel",
)
_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memcpy"}


def classify(name: str, patterns=COMM_PATTERNS) -> str:
    """"comm" if a kernel name looks like communication, else "compute"."""
    low = name.lower()
    return "comm" if any(re.search(p, low) for p in patterns) else "compute"


def _read(trace) -> dict:
    if isinstance(trace, dict):
        return trace
    if isinstance(trace, list):
        return {"traceEvents": trace}
    p = Path(trace)
    raw = gzip.open(p, "rt").read() if p.suffix == ".gz" else p.read_text()
    return json.loads(raw)


def load_torch_trace(trace, rank: int | None = None, *, patterns=COMM_PATTERNS) -> list[Span]:
    """Spans from a torch.profiler chrome trace (a path, .json.gz, or the parsed dict);
    also reads back commlab's own ``to_chrome_trace`` files.

    ``rank`` defaults to the trace's ``distributedInfo.rank`` (0 without one). Times are
    microseconds since the trace's first event."""
    d = _read(trace)
    if (d.get("otherData") or {}).get("producer") == "commlab.trace":
        return _from_commlab(d)
    events = [e for e in d.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    if rank is None:
        rank = int((d.get("distributedInfo") or {}).get("rank", 0))
    gpu = [e for e in events if e.get("cat") in _GPU_CATS]
    chosen = gpu or [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    if not chosen:
        return []
    t0 = min(float(e["ts"]) for e in chosen)
    out = []
    for e in chosen:
        name = str(e.get("name", ""))
        cat = e.get("cat")
        if cat in ("kernel", "cpu_op", "user_annotation"):
            kind = classify(name, patterns)
        else:
            kind = "memcpy"
        args = e.get("args") or {}
        if gpu:
            lane = f"stream {args.get('stream', e.get('tid', 0))}"
        else:
            lane = f"thread {e.get('tid', 0)}"
        s = float(e["ts"]) - t0
        out.append(Span(name, kind, rank, s, s + float(e["dur"]), lane=lane,
                        meta={"cat": cat, "source": "torch.profiler"}))
    out.sort(key=lambda sp: sp.start_us)
    return out


def _from_commlab(d: dict) -> list[Span]:
    """Read back what ``to_chrome_trace`` wrote (pid = rank, thread name = lane)."""
    ev = d.get("traceEvents", [])
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = []
    for e in ev:
        if e.get("ph") != "X":
            continue
        args = dict(e.get("args") or {})
        out.append(Span(e["name"], e.get("cat", "compute"), int(e["pid"]), float(e["ts"]),
                        float(e["ts"]) + float(e["dur"]), int(args.pop("bytes", 0)),
                        str(args.pop("algorithm", "")), lanes.get((e["pid"], e["tid"]), ""),
                        args))
    return sorted(out, key=lambda sp: (sp.rank, sp.start_us))


def _as_dict(s) -> dict:
    return s if isinstance(s, dict) else s.to_dict()


def to_chrome_trace(spans, path=None) -> dict:
    """Spans (objects or dicts) as chrome-trace JSON; written to ``path`` if given."""
    spans = [_as_dict(s) for s in spans]
    lanes: dict[tuple[int, str], int] = {}
    events = []
    for s in sorted(spans, key=lambda s: (s["rank"], s.get("lane") or "stream", s["start_us"])):
        key = (int(s["rank"]), s.get("lane") or "stream")
        if key not in lanes:
            lanes[key] = len([k for k in lanes if k[0] == key[0]])
        args = {k: s[k] for k in ("bytes", "algorithm") if s.get(k)}
        args.update({k: v for k, v in (s.get("meta") or {}).items()
                     if isinstance(v, (str, int, float, bool))})
        events.append({"name": s["name"], "cat": s["kind"], "ph": "X", "ts": s["start_us"],
                       "dur": max(0.0, s["end_us"] - s["start_us"]), "pid": key[0],
                       "tid": lanes[key], "args": args})
    for rank in sorted({k[0] for k in lanes}):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    for (rank, lane), tid in lanes.items():
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                       "args": {"name": lane}})
    out = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "commlab.trace"}}
    if path is not None:
        Path(path).write_text(json.dumps(out))
    return out


HTA_PREFIX = "ncclKernel_commlab_"


def mark_communication(trace, path=None, patterns=COMM_PATTERNS) -> dict:
    """A torch.profiler trace whose commlab GPU kernels HTA counts as communication.

    HTA classifies a kernel as communication by its name alone (``^nccl.*Kernel``), so
    each kernel that ``classify`` calls "comm" and NCCL did not name is renamed
    ``ncclKernel_commlab_<name>``, its own name kept in ``args["commlab_kernel"]`` and
    ``args["commlab_comm"] = 1``; nothing else changes. Written to ``path`` if given."""
    d = json.loads(json.dumps(_read(trace)))
    for e in d.get("traceEvents", []):
        name = str(e.get("name", ""))
        if (e.get("cat") == "kernel" and not name.lower().startswith("nccl")
                and classify(name, patterns) == "comm"):
            e["name"] = HTA_PREFIX + name
            e.setdefault("args", {}).update({"commlab_kernel": name, "commlab_comm": 1})
    if path is not None:
        Path(path).write_text(json.dumps(d))
    return d
