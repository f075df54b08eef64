"""Host cost of the agreement per call on the CPU backend, 2 ranks: waiting vs running ahead.

Two loops, each timed call by call (median, and the 90th percentile):

- ``agree``: the agreement alone on a probe signature, no kernel — what a
  call pays before it may launch (waiting: both hosts meet; ahead: publish and return);
- ``all_reduce``: a tiny ``all_reduce`` (8 fp32) end to end; on CPU the interpreter's
  kernel itself waits for the peer, so this shows what is left once the wait moves there;
- ``local``: one process, a peer simulated in the same block that has always published
  already: the agreement's own host work per call, with no waiting at all.

    COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 .venv/bin/python bench/checks/cpu_agreement_cost.py

Runs with whatever ``commlab`` is importable (``PYTHONPATH=<an older checkout>`` measures
that one; without the ahead path it reports the waiting rows only).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

AGREE_CALLS = 3000
REDUCE_CALLS = 300


def _times(fn, calls: int) -> list[float]:
    import torch.distributed as dist

    for _ in range(20):
        fn()
    dist.barrier()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _world(comm) -> list[tuple[str, str, float, float]]:
    import commlab
    from commlab.runtime import Signature

    ahead = getattr(comm.control, "ahead", None)
    modes = ["waiting", "ahead"] if ahead is not None else ["waiting"]
    sig = Signature("probe", {"shape": (8,), "dtype": "float32"})
    raw = sig.encode()
    x = torch.ones(8)
    rows = []
    for mode in modes:
        if ahead is not None:
            ahead.enabled = mode == "ahead"
            ahead.allow(raw, lambda: None)  # host-only probe: nothing to drain
        kw = {"ahead": True} if ahead is not None else {}
        agree = _times(lambda kw=kw: comm.control.agree(sig, raw, **kw), AGREE_CALLS)
        if ahead is not None:
            comm.control.settle()
        reduce = _times(lambda: commlab.all_reduce(x), REDUCE_CALLS)
        comm.synchronize()
        for name, t in (("agree", agree), ("all_reduce", reduce)):
            t.sort()
            rows.append((name, mode, statistics.median(t), t[int(0.9 * len(t))]))
    return rows


def _local(ahead: bool, calls: int = 20000) -> float:
    from commlab.runtime._control import ControlBlock, Signature

    buf = bytearray(ControlBlock.nbytes(2))
    me, peer = ControlBlock(buf, 0, 2, 30.0), ControlBlock(buf, 1, 2, 30.0)
    sig = Signature("all_reduce", {"shape": (8,), "dtype": "float32", "op": "sum"})
    raw = sig.encode()
    me.ahead.allow(raw, lambda: None)
    me.ahead.last = raw
    out = []
    for n in range(1, calls + 1):
        peer.publish(n, raw, ahead=ahead)
        peer.set_checked(n)
        t0 = time.perf_counter()
        me.agree(sig, raw, ahead=ahead)
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def main() -> None:
    import commlab
    from commlab.testing import run_world

    local = {}
    if hasattr(commlab.runtime._control.ControlBlock, "publish"):  # has the ahead path
        local = {("ahead" if a else "waiting"): _local(a) for a in (False, True)}
    results = run_world(_world, 2, timeout=600)
    print(f"commlab from {commlab.__file__}; 2 ranks, CPU backend, torch {torch.__version__}")
    print(f"{'loop':<11} {'mode':<8} {'rank':>4} {'median us':>10} {'p90 us':>9}")
    for rank, rows in enumerate(results):
        for name, mode, med, p90 in rows:
            print(f"{name:<11} {mode:<8} {rank:>4} {med:>10.1f} {p90:>9.1f}")
    for mode, med in local.items():
        print(f"{'local':<11} {mode:<8} {'-':>4} {med:>10.1f} {'-':>9}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
