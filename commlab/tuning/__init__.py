"""``algorithm="auto"`` from measurements: ``commlab.tune()`` and ``lookup``.

    comm = commlab.init()
    table = commlab.tune()          # collective: every rank calls; a progress bar on rank 0
    commlab.all_reduce(x)           # auto now runs the measured winner for x's size

``tune`` times every commlab algorithm side by side (``commlab.bench``, results verified
against NCCL/gloo first) at each swept size; rank 0 builds the table of per-size winners
and broadcasts it, so every rank chooses the same algorithm. Tables are cached in
``~/.cache/commlab/tuning/<fingerprint>.json`` (``COMMLAB_TUNING_DIR`` overrides the
folder), keyed by the topology fingerprint (backend, world size, device, NVLink
structure: see ``_fingerprint``); a changed topology has another fingerprint, so its old
table is never used. Tables measured by the maintainers ship in ``commlab/tuning/data``.

Before any tuning, ``lookup`` returns None and the documented defaults of
``commlab.collectives._select`` apply (one-shot up to 256 KiB, two-shot above).
Importing this module (``import commlab`` does) installs ``lookup`` as the table that
``auto`` asks first (``_select.use_tuning``); on CUDA the first ``auto`` call on a
communicator computes the fingerprint (topology discovery through NVML, once per process).
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left
from pathlib import Path

from commlab import _config
from commlab.collectives import _adapt, _select
from commlab.runtime import get_communicator
from commlab.tuning._fingerprint import fields as _fields
from commlab.tuning._fingerprint import fingerprint_of
from commlab.tuning._table import TuningTable, auto_violations, winners

__all__ = ["TuningTable", "auto_violations", "cache_dir", "fingerprint", "lookup",
           "table_path", "tune", "winners"]

PACKAGED = Path(__file__).parent / "data"
# ops with a choice to make, and their algorithms
TUNABLE = {"all_reduce": ("one_shot", "two_shot", "ring"),
           "all_gather": ("direct", "copy_engine"),
           "all_to_all": ("direct", "copy_engine"),
           "broadcast": ("direct", "copy_engine")}


def cache_dir() -> Path:
    d = _config.get("COMMLAB_TUNING_DIR")
    return Path(d) if d else Path.home() / ".cache" / "commlab" / "tuning"


def fingerprint(comm) -> str:
    return fingerprint_of(_fields(comm))


def table_path(comm, folder=None) -> Path:
    return Path(folder or cache_dir()) / f"{fingerprint(comm)}.json"


# --- lookup: called by every auto collective, so it must be cheap ---------------------


_comm = None  # the communicator the in-memory table belongs to
_table: TuningTable | None = None
_buckets: dict = {}  # (op, torch dtype) -> (bounds, algorithms), ready for bisect


def _install(comm, table: TuningTable | None) -> None:
    import torch

    buckets = {}
    if table is not None:
        for name in ("float32", "float16", "bfloat16", "int32"):
            for op, known in TUNABLE.items():
                b = table.buckets(op, name, comm.world_size, set(known))
                if b is not None:
                    buckets[(op, getattr(torch, name))] = b
    global _comm, _table, _buckets
    _comm, _table, _buckets = comm, table, buckets
    # Launch plans cached for auto calls remember the algorithm chosen under the old
    # table: drop them so the next auto call chooses again (every rank does this at the
    # same collective point, so the ranks stay in step).
    plans = getattr(comm, "plans", None)
    if plans:
        for key in [k for k in plans if k and k[0] in TUNABLE and k[-1] == "auto"]:
            del plans[key]
    # online selection (COMMLAB_ADAPT) starts again from the new table's choices
    if getattr(comm, "adapt", None):
        _adapt.reset(comm)


def _read_table(comm) -> TuningTable | None:
    """The cached table for this fingerprint, else a packaged one, else None."""
    fp = fingerprint(comm)
    for folder in (cache_dir(), PACKAGED):
        path = folder / f"{fp}.json"
        if path.exists():
            try:
                t = TuningTable.load(path)
            except (OSError, ValueError, KeyError):
                continue  # unreadable or from another schema: ignored, defaults apply
            if t.fingerprint == fp:
                return t
    return None


def _load(comm) -> None:
    """First lookup on a communicator: rank 0 reads the table and broadcasts it, so all
    ranks decide alike even if their disks differ. Called from inside a collective, after
    the ranks agreed on it, so every rank gets here at the same call."""
    table = _read_table(comm) if comm.rank == 0 else None
    members = getattr(comm, "members", None)
    if comm.world_size > 1 and members is not None and members.store is not None:
        # through the store: a rank lost meanwhile raises RankLostError, never a hang
        d = json.loads(members.share("tuning", json.dumps(
            table.to_dict() if table is not None else None) if comm.rank == 0 else None))
        table = TuningTable.from_dict(d) if d is not None else None
    elif comm.world_size > 1:
        import torch.distributed as dist

        box = [table.to_dict() if table is not None else None]
        dist.broadcast_object_list(box, group_src=0, group=comm.cpu_group)
        table = TuningTable.from_dict(box[0]) if box[0] is not None else None
    _install(comm, table)


def lookup(comm, op: str, dtype, nbytes: int) -> str | None:
    """The tuned algorithm for ``op`` on ``nbytes`` of ``dtype`` (a torch.dtype), or None
    when this topology has no table for it (callers then use their defaults)."""
    if comm is not _comm:
        _load(comm)
    b = _buckets.get((op, dtype))
    if b is None:
        return None
    return b[1][bisect_left(b[0], nbytes)]


def forget() -> None:
    """Drop the in-memory table (the next lookup reads the disk again)."""
    global _comm, _table, _buckets
    _comm, _table, _buckets = None, None, {}


# --- tune -----------------------------------------------------------------------------


def default_sizes(backend: str) -> list[int]:
    if backend == "cuda":  # powers of 4, 8 B .. 256 MiB
        return [8 << (2 * i) for i in range(13)] + [1 << 30]
    return [8, 4 << 10, 256 << 10, 4 << 20]


def tune(ops=("all_reduce",), sizes=None, dtypes=None, *, progress: bool = True,
         mode: str | None = None, iters: int | None = None, save: bool = True,
         comm=None) -> TuningTable:
    """Measure every algorithm of ``ops`` at ``sizes`` and install the winners; collective.

    sizes: bytes (default: powers of 4 from 8 B on GPU, 8 B..4 MiB on CPU). dtypes: names
    (default bfloat16 and float32 on GPU, float32 on CPU). mode: "graph" (default on
    GPU: device time, what separates algorithms at small sizes) or "eager". Returns the
    table, also written to ``table_path(comm)`` unless save=False."""
    import torch.distributed as dist

    from commlab import bench

    comm = comm or get_communicator()
    bad = [o for o in ops if o not in TUNABLE]
    if bad:
        raise ValueError(f"tune: {bad} have a single algorithm; tunable ops: {', '.join(TUNABLE)}")
    cuda = comm.backend == "cuda"
    sizes = [bench.parse_size(s) for s in (sizes or default_sizes(comm.backend))]
    dtypes = list(dtypes or (("bfloat16", "float32") if cuda else ("float32",)))
    mode = mode or ("graph" if cuda else "eager")
    iters = iters or (20 if cuda else 5)
    times: dict[tuple, dict[int, dict[str, float]]] = {}
    failures = []
    for dt in dtypes:
        for op in ops:
            res = bench.run(comm, ops=[op], sizes=sizes, dtype=dt, modes=(mode,), iters=iters,
                            algorithms=[f"commlab:{a}" for a in TUNABLE[op]], progress=progress)
            failures += [str(f) for f in res.failures]
            for r in res.records:
                times.setdefault((op, dt), {}).setdefault(r.bytes, {})[r.impl[8:]] = r.time_us
    table = None
    if comm.rank == 0:
        f = _fields(comm)
        table = TuningTable(fingerprint_of(f), f, meta={
            "mode": mode, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": bench._records.git_commit(), "failures": failures})
        for (op, dt), t in times.items():
            table.set(op, dt, comm.world_size, t)
    if comm.world_size > 1:
        box = [table.to_dict() if table is not None else None]
        dist.broadcast_object_list(box, group_src=0, group=comm.cpu_group)
        sent = box[0]
        assert sent is not None  # rank 0 always builds the table it sends
        table = TuningTable.from_dict(sent)
    assert table is not None  # built here on rank 0, received on the others
    if save and comm.local_rank == 0:  # one writer per host
        table.save(table_path(comm))
    _install(comm, table)
    return table


_select.use_tuning(lookup)
