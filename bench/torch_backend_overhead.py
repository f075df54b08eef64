"""Per-call cost of torch.distributed on the "commlab" backend against a direct commlab
call on the same tensor, CPU ranks, side by side in one run (issue 29 item 3: at most 1.1x).

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 .venv/bin/python bench/torch_backend_overhead.py --world 2

Spawns ``--world`` CPU ranks. For each op and size (``bytes`` as nccl-tests counts them:
all_gather's output, the others' input; rounded up to whole fp32 pieces per rank) the
direct call (``commlab:auto``: ``commlab.all_reduce(x)``, ...) and the backend's
(``torch-backend:commlab``: ``dist.all_reduce(x)``, ``dist.all_gather_single(out, x)``,
``dist.reduce_scatter_single``, ``dist.broadcast``, ``dist.all_to_all_single``; torch 2.13's
names of ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, whose old names also
pay a FutureWarning per call) are
checked against gloo on fresh random data, then timed interleaved after warm-up:
``--reps`` rounds, each ``--iters`` back-to-back calls of one impl then of the other; an
impl's time is the median round of the slowest rank. Writes the records to
``bench/results/cpu-torch-backend-overhead-w<W>.json`` and the table beside it (``.txt``)
with two ratios: backend / direct of those medians, and the median over rounds of each
backend round / the direct round next to it (drift on a shared box cancels), the slowest
rank's; ``--profile TAG`` also writes rank 0's cProfile
of the backend's calls to ``bench/results/profiles/cpu-torch-backend-TAG-w<W>.txt``.
"""

from __future__ import annotations

import cProfile
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._cpu_timing import parser, profile_text, round_us, slowest  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SIZES = (8, 1 << 10, 64 << 10, 1 << 20)  # total bytes (fp32)
IMPLS = ("commlab:auto", "torch-backend:commlab")
PROFILE_BYTES = (8, 64 << 10)
# torch 2.13's names (the *_tensor names are deprecated aliases that warn on every call)
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _elems(op: str, nbytes: int, world: int) -> int:
    """The total elements of the call: whole fp32 pieces of ``world`` for the split ops."""
    n = max(1, nbytes // 4)
    return n if op in ("all_reduce", "broadcast") else -(-n // world) * world


def _calls(op: str, n: int, world: int, groups: dict, x: torch.Tensor):
    """(direct(), backend(group), gloo()) on input ``x``; each returns its output."""
    import commlab

    part = n // world

    def backend(group):
        if op == "all_reduce":
            dist.all_reduce(x, group=group)
            return x
        if op == "broadcast":
            dist.broadcast(x, src=0, group=group)
            return x
        if op == "all_gather":
            out = x.new_empty(n)
            _ALL_GATHER(out, x, group=group)
            return out
        if op == "reduce_scatter":
            out = x.new_empty(part)
            _REDUCE_SCATTER(out, x, group=group)
            return out
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    def gloo():
        if op != "reduce_scatter":
            return backend(groups["gloo"])
        full = x.clone()  # gloo has no reduce_scatter_tensor: an all_reduce, then our chunk
        dist.all_reduce(full, group=groups["gloo"])
        me = dist.get_rank()
        return full[me * part:(me + 1) * part]

    if op == "broadcast":
        def direct():
            return commlab.broadcast(x, src=0)
    else:
        fn = getattr(commlab, op)

        def direct():
            return fn(x)
    return direct, backend, gloo


def _check(op: str, n: int, world: int, rank: int, groups: dict, gen) -> None:
    """Both impls give gloo's answer on fresh random data."""
    x_in = torch.randn(n // world if op == "all_gather" else n, generator=gen)
    got = {}
    for impl in (*IMPLS, "gloo"):
        x = x_in.clone()
        direct, backend, gloo = _calls(op, n, world, groups, x)
        got[impl] = (direct() if impl == "commlab:auto" else
                     backend(groups["commlab"]) if impl == "torch-backend:commlab" else gloo())
    for impl in IMPLS:
        torch.testing.assert_close(got[impl], got["gloo"], rtol=1e-5, atol=1e-5 * world,
                                   msg=lambda m, impl=impl: f"{op} {n} fp32 {impl}: {m}")


def _profile(world: int, rank: int, groups: dict, calls: int, ops: tuple) -> str:
    """Rank 0's cProfile of ``calls`` backend calls of each of ``ops`` at PROFILE_BYTES."""
    text = []
    for nbytes in PROFILE_BYTES:
        prof = cProfile.Profile()
        for op in ops:
            n = _elems(op, nbytes, world)
            x = torch.zeros(n // world if op == "all_gather" else n)
            _, backend, _ = _calls(op, n, world, groups, x)
            for _ in range(3):
                backend(groups["commlab"])
            dist.barrier(group=groups["gloo"])
            prof.enable()
            for _ in range(calls):
                backend(groups["commlab"])
            prof.disable()
        text += profile_text(prof, f"rank {rank}: {calls} backend calls of each op at "
                             f"{nbytes} B", (("tottime", 30), ("cumulative", 45)))
    return "\n".join(text)


def bench(comm, sizes: tuple, iters: int, reps: int, profile_calls: int,
          ops: tuple = OPS) -> dict:
    import commlab
    from commlab.bench._records import Record, git_commit

    dist.init_process_group("commlab")
    groups = {"commlab": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    comm = commlab.init()
    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(1234 + rank)
    device, commit = f"cpu ({os.cpu_count()} cores)", git_commit(ROOT)
    records, ratios = [], {}
    for op in ops:
        for nbytes in sizes:
            n = _elems(op, nbytes, world)
            _check(op, n, world, rank, groups, gen)
            x = torch.zeros(n // world if op == "all_gather" else n)  # stays finite
            direct, backend, _ = _calls(op, n, world, groups, x)
            fns = {"commlab:auto": direct,
                   "torch-backend:commlab": lambda b=backend: b(groups["commlab"])}
            for fn in fns.values():  # warm-up: plans made, both paths hot
                for _ in range(5):
                    fn()
            times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            for r in range(reps):  # alternate which goes first: drift cancels
                for impl in (IMPLS if r % 2 == 0 else IMPLS[::-1]):
                    times[impl].append(round_us(fns[impl], iters, groups["gloo"]))
            comm.synchronize()
            paired = statistics.median(b / d for d, b in zip(*times.values(), strict=True))
            ratios[(op, n * 4)] = slowest(paired, groups["gloo"])
            for impl in IMPLS:
                worst = slowest(statistics.median(times[impl]), groups["gloo"])
                records.append(Record.measured(op=op, impl=impl, dtype="float32",
                                               nbytes=n * 4, world_size=world,
                                               time_us=worst, device=device,
                                               commit=commit, mode="eager"))
    prof = _profile(world, rank, groups, profile_calls, ops) if profile_calls else ""
    dist.barrier(group=groups["gloo"])
    dist.destroy_process_group()
    return ({"records": [r.__dict__ for r in records], "ratios": ratios, "profile": prof}
            if rank == 0 else {})


def table(records: list[dict], ratios: dict) -> str:
    """One line per op and size: both impls' µs per call, backend / direct of those, and
    the median of the paired rounds' ratios."""
    by = {(r["op"], r["bytes"], r["impl"]): r["time_us"] for r in records}
    lines = [f"{'op':<15}{'bytes':>9}  {'direct us':>10}  {'backend us':>10}  {'ratio':>6}"
             f"  {'paired':>6}"]
    for op, nbytes, impl in by:
        if impl != IMPLS[0]:
            continue
        d, b = by[(op, nbytes, IMPLS[0])], by[(op, nbytes, IMPLS[1])]
        lines.append(f"{op:<15}{nbytes:>9}  {d:>10.1f}  {b:>10.1f}  {b / d:>6.2f}"
                     f"  {ratios[(op, nbytes)]:>6.2f}")
    return "\n".join(lines)


def main() -> None:
    p = parser(__doc__, 2, 20, 15, "profiles/cpu-torch-backend-TAG-w<W>.txt")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="total bytes, comma-separated")
    p.add_argument("--ops", default=",".join(OPS), help="ops to time, comma-separated")
    p.add_argument("--profile-calls", type=int, default=100)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from commlab.testing import run_world

    sizes = tuple(int(s) for s in a.sizes.split(","))
    ops = tuple(a.ops.split(","))
    if not set(ops) <= set(OPS):
        p.error(f"--ops: {sorted(set(ops) - set(OPS))} unknown; pick from {', '.join(OPS)}")
    env = {"COMMLAB_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
    got = run_world(bench, a.world,
                    args=(sizes, a.iters, a.reps, a.profile_calls if a.profile else 0, ops),
                    init=False, timeout=1800, env=env)[0]
    records = got["records"]
    text = table(records, got["ratios"])
    print(text)
    results = ROOT / "bench" / "results"
    out = Path(a.out) if a.out else results / f"cpu-torch-backend-overhead-w{a.world}.json"
    out.write_text(json.dumps(records, indent=1) + "\n")
    out.with_suffix(".txt").write_text(
        f"# bench/torch_backend_overhead.py --world {a.world} --iters {a.iters} --reps "
        f"{a.reps}, commit {records[0]['commit']}, {records[0]['device']}\n{text}\n")
    print(f"wrote {out} and {out.with_suffix('.txt').name}")
    if a.profile:
        prof = results / "profiles" / f"cpu-torch-backend-{a.profile}-w{a.world}.txt"
        prof.parent.mkdir(exist_ok=True)
        prof.write_text(f"# bench/torch_backend_overhead.py --profile {a.profile}, commit "
                        f"{records[0]['commit']}, {a.world} ranks\n\n{got['profile']}")
        print(f"wrote {prof}")


if __name__ == "__main__":
    main()
