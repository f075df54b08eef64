"""Eager per-call cost of every collective, side by side: commlab vs symm-mem vs NCCL.

One GPU, one command (issue 29):

    python bench/eager_bench.py                 # world of 1 -> bench/results/h200-eager-w1.json
    python bench/eager_bench.py --ranks 2       # 2 ranks sharing the GPU -> ...-w2.json

For all_reduce, all_gather, reduce_scatter, broadcast and all_to_all at 8 B .. 1 MiB
(powers of 4, and 1 MiB; ``bytes`` as nccl-tests counts them): ``commlab:auto``, NCCL for
the same op and torch symmetric memory's one_shot all_reduce of the same size, each checked
against NCCL (gloo on host copies where NCCL cannot run: ranks sharing a GPU) before it is
timed, then timed eagerly with CUDA events: ``inner`` back-to-back calls between two
events, the slowest rank's (so host cost shows when it is larger than the device's),
``reps`` times. The implementations of one (op, size) are sampled in rounds, in turn, and
the ratios the goal reads are medians over rounds of the ratio within a round: a host that
drifts between fast and slow states (seen on the H100 hosts: ±30%) moves them alike. Also the torch backend: ``dist.all_reduce`` on the
"commlab" group against ``commlab.all_reduce`` of the same tensor, and commlab's launch
plan as it was before issue 29 (``legacy``: ``kernel[grid]``, a fresh output, the
agreement through ``agree``) for the before/after profile.

Writes ``<name>-eager-w<N>.json`` (records, ``shared/DESIGN.md``'s format, mode "eager"),
``<name>-eager-w<N>-extra.json`` (torch backend and legacy rows, goal verdicts) and
``<name>-eager-w<N>-profile.txt`` (cProfile and torch.profiler of one eager all_reduce,
legacy then current). ``--backend cpu --quick`` runs the same code on the CPU backend
(gloo as the reference and baseline; the test suite runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("COMMLAB_TORCH_BACKEND", "commlab")  # dist.* on the "commlab" backend
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import commlab  # noqa: E402
from commlab.bench._impls import input_numel  # noqa: E402
from commlab.bench._records import Record, device_name, git_commit  # noqa: E402
from commlab.bench._runner import check  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SIZES = [8 << (2 * k) for k in range(9)] + [1 << 20]  # 8 B, 32 B, ... 512 KiB, 1 MiB
QUICK_SIZES = [8, 2048]
COMMLAB = "commlab:auto"
SYMM = "torch_symm_mem:one_shot"


# --- inputs, reference, calls -------------------------------------------------------


def make_input(op: str, nbytes: int, dtype, comm, seed: int = 0):
    elem = torch.tensor([], dtype=dtype).element_size()
    n, total = input_numel(op, nbytes, elem, comm.world_size)
    g = torch.Generator().manual_seed(seed * 1009 + comm.rank * 7919 + nbytes)
    x = torch.randn(n, generator=g).to(dtype) if dtype.is_floating_point else \
        torch.randint(-100, 100, (n,), generator=g, dtype=dtype)
    return x.to(comm.device), total


def _host_reference(op: str, comm, x: torch.Tensor) -> torch.Tensor:
    """gloo on host copies (the CPU backend, and ranks sharing a GPU, where NCCL refuses)."""
    g, w, h = comm.cpu_group, comm.world_size, x.detach().cpu().float()
    if op in ("all_reduce", "reduce_scatter"):
        dist.all_reduce(h, group=g)
        out = h if op == "all_reduce" else h.chunk(w)[comm.rank]
    elif op == "broadcast":
        dist.broadcast(h, src=_global(comm, 0), group=g)
        out = h
    elif op == "all_gather":
        parts = [torch.empty_like(h) for _ in range(w)]
        dist.all_gather(parts, h, group=g)
        out = torch.cat(parts)
    else:  # all_to_all: chunk j of rank r lands at chunk r of rank j
        parts = [torch.empty_like(h) for _ in range(w)]
        dist.all_gather(parts, h, group=g)
        out = torch.cat([p.chunk(w)[comm.rank] for p in parts])
    return out.to(x.dtype).to(x.device)


def _global(comm, r: int) -> int:
    return dist.get_global_rank(comm.cpu_group, r) if comm.cpu_group is not None else r


def nccl_call(op: str, comm, x: torch.Tensor):
    """The NCCL call of ``op`` (on comm.group), returning its output; None where absent."""
    if comm.backend != "cuda" or _shared(comm):
        return None
    g, w = comm.group, comm.world_size
    if op == "all_reduce":
        y = x.clone()
        return lambda: (dist.all_reduce(y, group=g), y)[1]
    if op == "broadcast":
        y = x.clone()
        return lambda: (dist.broadcast(y, src=_global(comm, 0), group=g), y)[1]
    if op == "all_gather":
        out = torch.empty(w * x.numel(), dtype=x.dtype, device=x.device)
        return lambda: (dist.all_gather_into_tensor(out, x, group=g), out)[1]
    if op == "reduce_scatter":
        out = torch.empty(x.numel() // w, dtype=x.dtype, device=x.device)
        return lambda: (dist.reduce_scatter_tensor(out, x, group=g), out)[1]
    out = torch.empty_like(x)
    return lambda: (dist.all_to_all_single(out, x, group=g), out)[1]


def commlab_call(op: str, x: torch.Tensor):
    fn = getattr(commlab, op)
    return lambda: fn(x)


def symm_call(comm, x: torch.Tensor):
    """torch symm-mem one_shot all_reduce of a copy of ``x``; None where unavailable."""
    if comm.backend != "cuda" or _shared(comm):
        return None
    import torch.distributed._symmetric_memory as symm_mem

    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        return None
    t = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(t, comm.group.group_name)
    t.copy_(x)
    name = comm.group.group_name
    return lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", name)


def torch_backend_call(x: torch.Tensor):
    """``dist.all_reduce`` on the default group (the "commlab" backend), in place on a copy."""
    y = x.clone()
    return lambda: (dist.all_reduce(y), y)[1], lambda: y.copy_(x)


def _shared(comm) -> bool:
    placement = getattr(getattr(comm, "_world", None), "placement", None)
    return bool(getattr(placement, "shared", False))


# --- timing -------------------------------------------------------------------------


def _align(comm) -> None:
    comm.synchronize()
    if comm.backend == "cuda":
        torch.cuda.synchronize(comm.device)
    dist.barrier(group=comm.cpu_group)


def _sample_us(comm, call, inner: int, ev) -> float:
    """µs per call of ``inner`` back-to-back calls, after every rank is aligned."""
    _align(comm)
    if ev is not None:
        ev[0].record()
    t0 = time.perf_counter()
    for _ in range(inner):
        call()
    if ev is None:
        return (time.perf_counter() - t0) * 1e6 / inner
    ev[1].record()
    ev[1].synchronize()
    return ev[0].elapsed_time(ev[1]) * 1e3 / inner


def _slowest(comm, values: list[float]) -> list[float]:
    """Each value's maximum over the ranks."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=comm.cpu_group)
    return t.tolist()


def time_us(comm, call, *, reps: int, inner: int, warmup: int) -> float:
    """Median µs per call of ``inner`` back-to-back calls (CUDA events on GPU, the host
    clock on CPU), over ``reps`` runs; the slowest rank's median."""
    return statistics.median(time_rounds(comm, {"x": call}, reps=reps, inner=inner,
                                         warmup=warmup)["x"])


def time_rounds(comm, calls: dict, *, reps: int, inner: int, warmup: int) -> dict:
    """Per implementation, ``reps`` samples (µs per call, the slowest rank's) taken in
    rounds: each round samples every implementation once, in a rotating order, so a
    machine that drifts between fast and slow states moves all of them alike and a
    round's ratios compare like with like."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    ev = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          if comm.backend == "cuda" else None)
    samples: dict = {n: [] for n in names}
    for k in range(reps):
        for name in names[k % len(names):] + names[:k % len(names)]:
            samples[name].append(_sample_us(comm, calls[name], inner, ev))
    flat = _slowest(comm, [v for n in names for v in samples[n]])
    return {n: flat[i * reps:(i + 1) * reps] for i, n in enumerate(names)}


def paired(a: list[float], b: list[float]) -> float:
    """The median over rounds of a / b (time_rounds' samples of two implementations)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


@contextlib.contextmanager
def legacy_plans(comm):
    """Launch plans as before issue 29: ``kernel[grid]`` with tensors, a fresh output per
    call, the agreement through ``agree`` (Signature, bytes compared), no C entry."""
    from commlab.collectives import _outputs, _plan

    control = comm.control
    saved = {k: p.fire for k, p in comm.plans.items()}
    for p in comm.plans.values():  # the public functions' dispatch skips retired entries
        if p.entry is not None:
            p.entry.retire()
            p.entry = None
    reuse = _outputs.REUSE[0]
    repeat = control.repeat
    _outputs.REUSE[0] = False
    control.repeat = lambda rec: control.agree(rec.sig, rec.raw, ahead=True)
    for p in comm.plans.values():
        p.fire = None
    try:
        yield
    finally:
        control.repeat = repeat
        _outputs.REUSE[0] = reuse
        for k, fire in saved.items():
            if k in comm.plans:
                comm.plans[k].fire = fire
                _plan.build_entry(comm, comm.plans[k])


# --- the run ------------------------------------------------------------------------


def measure(comm, opts: dict) -> dict:
    """Every row of one run on this rank (the same list on every rank)."""
    dtype = getattr(torch, opts["dtype"])
    reps, inner, warmup = opts["reps"], opts["inner"], opts["warmup"]
    rows, pairs, failures, notes = [], [], [], []

    def checked(op, impl, nbytes, call, ref=None, reset=None):
        """``call`` after its first call (the slow path, leaving the plan) and a repeat
        that equals ``ref`` on every rank; None (a failure noted) otherwise."""
        try:
            if reset is not None:
                reset()
            call()
            if reset is not None:
                reset()
            if ref is not None:
                bad = check(call(), ref.reshape(-1), comm.world_size)
                bad_all = [None] * comm.world_size
                dist.all_gather_object(bad_all, bad, group=comm.cpu_group)
                if any(bad_all):
                    failures.append(f"{op} {impl} {nbytes} B: "
                                    + "; ".join(f"rank {r}: {b}" for r, b in enumerate(bad_all) if b))
                    return None
        except Exception as e:  # noqa: BLE001 - one failed impl must not end the run
            failures.append(f"{op} {impl} {nbytes} B: {type(e).__name__}: {str(e)[:300]}")
            return None
        return call

    def timed(op, impl, nbytes, call, ref=None, reset=None):
        call = checked(op, impl, nbytes, call, ref, reset)
        if call is None:
            return None
        us = time_us(comm, call, reps=reps, inner=inner, warmup=warmup)
        rows.append({"op": op, "impl": impl, "bytes": nbytes, "time_us": us})
        return us

    for nbytes in opts["sizes"]:
        sym = None  # symm-mem one_shot all_reduce of this size: timed beside every op
        for op in opts["ops"]:
            x, total = make_input(op, nbytes, dtype, comm)
            ref = _host_reference(op, comm, x)
            try:
                nccl = nccl_call(op, comm, x)
                if nccl is not None:
                    got = nccl()
                    bad = check(got, ref.reshape(-1), comm.world_size)
                    if bad:
                        failures.append(f"{op} nccl {total} B disagrees with gloo: {bad}")
                    ref = got.clone()  # NCCL is the reference wherever it runs
            except Exception as e:  # noqa: BLE001 - reported; commlab is checked against gloo
                failures.append(f"{op} nccl {total} B: {type(e).__name__}: {str(e)[:300]}")
                nccl = None
            group = {COMMLAB: checked(op, COMMLAB, total, commlab_call(op, x), ref)}
            if nccl is not None:
                group["nccl"] = nccl
            if op == "all_reduce":
                try:
                    sym = symm_call(comm, x)
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    failures.append(f"symm-mem {total} B: {type(e).__name__}: {str(e)[:300]}")
                    sym = None
                if sym is not None:
                    sym = checked(op, SYMM, total, sym, ref)
                if opts["torch_backend"]:
                    call, reset = torch_backend_call(x)
                    group["torch_backend:commlab"] = checked(op, "torch_backend:commlab", total,
                                                             call, ref, reset)
            if sym is not None:
                group[SYMM] = sym
            group = {k: v for k, v in group.items() if v is not None}
            got = time_rounds(comm, group, reps=reps, inner=inner, warmup=warmup) if group else {}
            for impl, samples in got.items():
                if impl != SYMM or op == "all_reduce":  # symm-mem's record: its own op's row
                    rows.append({"op": op, "impl": impl, "bytes": total,
                                 "time_us": statistics.median(samples)})
            if COMMLAB in got:
                pair = {"op": op, "bytes": total}
                for other, key in ((SYMM, "vs_symm"), ("nccl", "vs_nccl"),
                                   ("torch_backend:commlab", "torch_backend_vs_direct")):
                    if other in got:
                        a, b = (got[other], got[COMMLAB]) if key.startswith("torch") else (
                            got[COMMLAB], got[other])
                        pair[key] = paired(a, b)
                if SYMM in got:
                    pair["symm_us_beside"] = statistics.median(got[SYMM])
                pairs.append(pair)
            if op == "all_reduce":
                with legacy_plans(comm):
                    timed(op, "commlab:auto(legacy)", total, commlab_call(op, x), ref)
        comm.synchronize()
    if _shared(comm):
        notes.append("ranks share one GPU: NCCL refuses the same GPU twice and symmetric "
                     "memory overlapping devices, so neither runs; references by gloo")
    return {"rows": rows, "pairs": pairs, "failures": failures, "notes": notes}


def profile_text(comm, nbytes: int, dtype, calls: int = 200) -> str:
    """cProfile (host) and torch.profiler (host + device) of ``calls`` eager all_reduces,
    the legacy plan then the current one."""
    x, _ = make_input("all_reduce", nbytes, dtype, comm)
    for _ in range(3):  # the plan exists before the legacy context takes its launcher away
        commlab.all_reduce(x)
    out = io.StringIO()
    for label, ctx in (("legacy plan (before issue 29)", legacy_plans(comm)),
                       ("current plan", contextlib.nullcontext())):
        with ctx:
            for _ in range(20):
                commlab.all_reduce(x)
            _align(comm)
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            for _ in range(calls):
                commlab.all_reduce(x)
            prof.disable()
            wall = (time.perf_counter() - t0) / calls * 1e6
            comm.synchronize()
            out.write(f"=== {label}: all_reduce {nbytes} B {dtype}, {calls} eager calls, "
                      f"{wall:.1f} us per call under cProfile (host) ===\n")
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
            acts = [torch.profiler.ProfilerActivity.CPU]
            if comm.backend == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            _align(comm)
            with torch.profiler.profile(activities=acts) as tp:
                for _ in range(calls):
                    commlab.all_reduce(x)
                comm.synchronize()
            out.write(f"--- torch.profiler, {label} ---\n")
            out.write(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
            out.write("\n")
    return out.getvalue()


def rank_main(comm, opts: dict) -> dict:
    """Everything one rank does; rank 0's result is written out."""
    result = measure(comm, opts)
    try:
        result["profile"] = profile_text(comm, opts["profile_bytes"],
                                         getattr(torch, opts["dtype"]), calls=opts["profile_calls"])
    except Exception as e:  # noqa: BLE001 - the timings are written anyway
        result["profile"] = f"profile failed: {type(e).__name__}: {e}\n"
        result["failures"].append(result["profile"].strip())
    result["device"] = device_name(comm)
    result["world_size"] = comm.world_size
    result["backend"] = comm.backend
    return result


# --- report -------------------------------------------------------------------------


def verdicts(rows: list[dict], pairs: list[dict] | None = None) -> list[dict]:
    """Per (op, bytes): commlab's time and its ratios to symm-mem one_shot all_reduce of
    the same bytes (goal <= 0.8) and to NCCL's same op (goal < 1): the median over rounds
    of the ratio of samples taken side by side (``pairs``) where the run has them, else
    the ratio of the medians."""
    by = {(r["op"], r["impl"], r["bytes"]): r["time_us"] for r in rows}
    side = {(p["op"], p["bytes"]): p for p in pairs or []}
    out = []
    for (op, impl, nbytes), us in sorted(by.items(), key=lambda kv: (OPS.index(kv[0][0]), kv[0][2])):
        if impl != COMMLAB:
            continue
        pair = side.get((op, nbytes), {})
        symm = pair.get("symm_us_beside", by.get(("all_reduce", SYMM, nbytes)))
        nccl = by.get((op, "nccl", nbytes))
        v = {"op": op, "bytes": nbytes, "commlab_us": us, "symm_us": symm, "nccl_us": nccl,
             "vs_symm": pair.get("vs_symm", us / symm if symm else None),
             "vs_nccl": pair.get("vs_nccl", us / nccl if nccl else None),
             "paired": bool(pair)}
        v["goal"] = (v["vs_symm"] is not None and v["vs_symm"] <= 0.8
                     and v["vs_nccl"] is not None and v["vs_nccl"] < 1.0)
        tb, legacy = by.get((op, "torch_backend:commlab", nbytes)), by.get((op, "commlab:auto(legacy)", nbytes))
        if tb:
            v["torch_backend_us"] = tb
            v["torch_backend_vs_direct"] = pair.get("torch_backend_vs_direct", tb / us)
        if legacy:
            v["legacy_us"] = legacy
        out.append(v)
    return out


def table(vs: list[dict]) -> str:
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [f"{'op':<15}{'bytes':>8} {'commlab':>9} {'legacy':>9} {'symm1s':>9} {'nccl':>9}"
             f"{'/symm':>7}{'/nccl':>7}{'dist/direct':>12}  goal"]
    for v in vs:
        lines.append(f"{v['op']:<15}{v['bytes']:>8} {f(v['commlab_us']):>9} "
                     f"{f(v.get('legacy_us')):>9} {f(v['symm_us']):>9} {f(v['nccl_us']):>9}"
                     f"{f(v['vs_symm']):>7}{f(v['vs_nccl']):>7}"
                     f"{f(v.get('torch_backend_vs_direct')):>12}  {'met' if v['goal'] else 'no'}")
    return "\n".join(lines)


def write(result: dict, opts: dict) -> list[Path]:
    w = result["world_size"]
    out_dir = Path(opts["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{opts['name']}-eager-w{w}"
    commit = os.environ.get("COMMLAB_COMMIT") or git_commit(ROOT)
    records = [Record.measured(op=r["op"], impl=r["impl"], dtype=opts["dtype"], nbytes=r["bytes"],
                               world_size=w, time_us=r["time_us"], device=result["device"],
                               commit=commit, mode="eager").__dict__
               for r in result["rows"] if r["impl"] in (COMMLAB, "nccl", SYMM)]
    vs = verdicts(result["rows"], result.get("pairs"))
    paths = [stem.with_suffix(".json"), Path(f"{stem}-extra.json"), Path(f"{stem}-profile.txt")]
    paths[0].write_text(json.dumps(records, indent=1) + "\n")
    paths[1].write_text(json.dumps({"commit": commit, "device": result["device"],
                                    "rows": result["rows"], "pairs": result.get("pairs", []),
                                    "verdicts": vs,
                                    "failures": result["failures"], "notes": result["notes"],
                                    "options": opts}, indent=1) + "\n")
    paths[2].write_text(result["profile"])
    return paths


def parse(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1, choices=(1, 2, 3, 4))
    p.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--quick", action="store_true", help="two sizes, few calls (tests)")
    p.add_argument("--out-dir", "--out", dest="out_dir", default=str(ROOT / "bench" / "results"))
    p.add_argument("--name", default=None, help="file prefix (default: h200 on an H200)")
    p.add_argument("--no-torch-backend", action="store_true")
    a = p.parse_args(argv)
    quick = a.quick or a.backend == "cpu"
    shared = a.ranks > 1
    return {"ranks": a.ranks, "backend": a.backend, "dtype": a.dtype,
            "ops": [o for o in a.ops.split(",") if o],
            "sizes": QUICK_SIZES if a.quick else SIZES,
            # ranks sharing a GPU time-slice it: each call takes milliseconds
            "reps": 3 if quick else (7 if shared else 15),
            "inner": 2 if quick else (10 if shared else 100),
            "warmup": 2 if quick else (5 if shared else 30),
            "profile_bytes": 8192, "profile_calls": 5 if quick else (20 if shared else 200),
            "out_dir": a.out_dir, "name": a.name, "torch_backend": not a.no_torch_backend}


def _rank_entry(comm, opts: dict) -> dict:  # module level: run_world pickles it
    return rank_main(comm, opts)


def main(argv=None) -> int:
    opts = parse(argv)
    t0 = time.monotonic()
    if opts["ranks"] == 1:
        comm = commlab.init(backend=opts["backend"])
        try:
            result = rank_main(comm, opts)
        finally:
            commlab.finalize()
    else:
        from commlab.testing import run_world

        env = {k: os.environ[k] for k in ("COMMLAB_TORCH_BACKEND", "NCCL_NVLS_ENABLE",
                                          "TORCH_SYMM_MEM_DISABLE_MULTICAST")}
        if opts["backend"] == "cuda":
            env["COMMLAB_DEVICE"] = "0"  # every rank on the one GPU
        result = run_world(_rank_entry, opts["ranks"], args=(opts,), backend=opts["backend"],
                           env=env, timeout=270)[0]
    if opts["name"] is None:
        opts["name"] = "h200" if "H200" in result["device"].upper() else (
            "cpu" if result["backend"] == "cpu" else result["device"].split()[-1].lower())
    paths = write(result, opts)
    vs = verdicts(result["rows"], result.get("pairs"))
    print(f"world {result['world_size']}, {result['device']}, {opts['dtype']}, torch "
          f"{torch.__version__}; us per eager call (median of {opts['reps']} x "
          f"{opts['inner']} back-to-back calls, every implementation of a row sampled in "
          f"turn; ratios: median over those rounds); goal: /symm <= 0.8 and /nccl < 1")
    print(table(vs))
    for n in result["notes"]:
        print("note:", n)
    for f in result["failures"]:
        print("FAIL", f)
    met = sum(v["goal"] for v in vs)
    print(f"goal met at {met} of {len(vs)} (op, size); {len(result['failures'])} failures; "
          f"{time.monotonic() - t0:.0f} s; wrote {', '.join(map(str, paths))}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
