"""A rank lost while the others spin inside kernels on a GPU (issue 27 item 1): ranks
sharing one GPU through the IPC heap, the store served by this process (any rank may
die). Per scenario, a fresh world; the last rank is SIGKILLed while the others spin:

  wait        in a user kernel's ``cl.wait(flag, 1, ctx)`` for a notify that never comes
  barrier     in a user kernel's ``cl.barrier(ctx)``
  all_reduce  in commlab's all_reduce kernel (the victim's own launch is queued behind a
              long ``torch.cuda._sleep``, so the others' kernels wait for its signals)

Every survivor must get RankLostError within COMMLAB_PEER_TIMEOUT + 1 s of the SIGKILL
(the host's abort word makes the spin return; ``commlab.synchronize()`` raises), then
``commlab.shrink()``, then a correct all_reduce in the smaller world and a symmetric
tensor of the first world kept. Then the abort check's cost, in a world without deaths:
a ping-pong between ranks 0 and 1 with ``cl.wait(ptr, v)`` (no abort check) against
``cl.wait(ptr, v, ctx)`` (wait record + abort word every CHECK_EVERY spins), and the eager
all_reduce per call.

    python bench/checks/gpu_elastic_abort.py --ranks 2 --out bench/results/gpu-elastic-abort-w2.json
    python bench/checks/gpu_elastic_abort.py --ranks 4 --out bench/results/gpu-elastic-abort-w4.json
    python bench/checks/gpu_elastic_abort.py --backend cpu --ranks 3 --out /tmp/a.json  # harness

Prints one PASS/FAIL line per check and exits 1 on any FAIL; a watchdog ends it at 540 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# the check is of the abort word, which kernels compile in only when asked (read at import;
# spawned ranks inherit it)
os.environ.setdefault("COMMLAB_GPU_ABORT", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import commlab  # noqa: E402
import commlab.language as cl  # noqa: E402
from commlab.bench import git_commit  # noqa: E402
from commlab.testing import run_world  # noqa: E402

PEER_TIMEOUT = 1.0
SCENARIOS = ("wait", "barrier", "all_reduce")


@triton.jit
def wait_kernel(flag, ctx):
    cl.wait(flag, 1, ctx)


@triton.jit
def barrier_kernel(ctx):
    cl.barrier(ctx)


@triton.jit
def pingpong_kernel(flag, ctx, ROUNDS: tl.constexpr, WITH_CTX: tl.constexpr):
    """Rank 0 sets rank 1's flag[0] = i and waits for its own flag[1] >= i; rank 1 the
    mirror image: ROUNDS round trips."""
    me = cl.rank(ctx)
    for i in range(1, ROUNDS + 1):
        if me == 0:
            cl.notify(flag, 1, ctx, i)
            if WITH_CTX:
                cl.wait(flag + 1, i, ctx)
            else:
                cl.wait(flag + 1, i)
        else:
            if WITH_CTX:
                cl.wait(flag, i, ctx)
            else:
                cl.wait(flag, i)
            cl.notify(flag + 1, 0, ctx, i)


def _note(note_dir: str, name: str, value) -> None:
    path = os.path.join(note_dir, name)
    with open(path + ".tmp", "w") as f:
        f.write(str(value))
    os.replace(path + ".tmp", path)


def _sync(comm) -> None:
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)


def abort_world(comm, scenario: str, note_dir: str) -> dict:
    me, victim, dev = comm.rank, comm.world_size - 1, comm.device
    _note(note_dir, f"pid{me}", os.getpid())
    kept = commlab.symmetric_zeros((1024,))
    kept.fill_(float(me))
    flag = commlab.symmetric_zeros((4,), torch.int32)
    x = torch.ones(4096, device=dev)
    commlab.all_reduce(x)  # compiles, and leaves a plan: the next call runs ahead
    commlab.barrier()
    _sync(comm)
    if me == victim:
        def die(*_):
            _note(note_dir, "killed", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        if scenario == "all_reduce" and dev.type == "cuda":
            torch.cuda._sleep(int(4e9))  # ~2 s: our kernel waits behind it
            commlab.all_reduce(x)
        # (the harness on the CPU: the victim never calls it; the others' agreement,
        # not a kernel, finds it lost)
        time.sleep(0.5)
        die()
    out: dict = {"me": me, "error": None}
    try:
        if scenario == "wait":
            wait_kernel[(1,)](flag, comm.context)
        elif scenario == "barrier":
            barrier_kernel[(1,)](comm.context)
        else:
            commlab.all_reduce(x)
        _sync(comm)  # returns once the abort word made the kernel give up
        commlab.synchronize()
        out["error"] = "no RankLostError"
    except commlab.RankLostError as e:
        out["caught"], out["text"], out["lost"] = time.time(), str(e), e.lost
    t0 = time.monotonic()
    new = commlab.shrink()
    out["shrink_s"] = time.monotonic() - t0
    w = new.world_size
    y = commlab.all_reduce(torch.full((1000,), float(new.rank + 1), device=dev))
    out["done"] = time.time()
    out["all_reduce_ok"] = bool(torch.all(y == w * (w + 1) / 2))
    z = commlab.all_reduce(kept)
    out["kept_ok"] = bool(torch.all(kept == me)) and bool(torch.all(z == sum(range(w))))
    out["world"] = w
    return out


def cost_world(comm, rounds: int, repeats: int) -> dict:
    """Ping-pong per round trip (ranks 0 and 1) without and with ctx, and the eager
    all_reduce per call, medians of ``repeats``."""
    flag = commlab.symmetric_zeros((8,), torch.int32)
    out: dict = {}
    for with_ctx in (False, True, False, True):  # interleaved: drift hits both alike
        times = []
        for _ in range(repeats):
            flag.zero_()
            commlab.barrier()
            _sync(comm)
            t0 = time.perf_counter()
            if comm.rank < 2:
                pingpong_kernel[(1,)](flag, comm.context, rounds, with_ctx)
            _sync(comm)
            times.append((time.perf_counter() - t0) / rounds * 1e6)
        out.setdefault("pingpong_with_ctx_us" if with_ctx else "pingpong_us", []).extend(times)
    out = {k: statistics.median(v) for k, v in out.items()}
    for nbytes in (8, 65536):
        x = torch.ones(max(1, nbytes // 4), device=comm.device)
        for _ in range(20):
            commlab.all_reduce(x)
        _sync(comm)
        t0 = time.perf_counter()
        for _ in range(500):
            commlab.all_reduce(x)
        _sync(comm)
        out[f"all_reduce_{nbytes}B_us"] = (time.perf_counter() - t0) / 500 * 1e6
    return out



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    def watchdog():
        time.sleep(540)
        print("FAIL: watchdog (540 s): something hung", flush=True)
        os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    env = {"COMMLAB_PEER_TIMEOUT": str(PEER_TIMEOUT), "COMMLAB_TIMEOUT": "60",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    record: dict = {"check": "gpu_elastic_abort", "ranks": args.ranks, "backend": args.backend,
                    "peer_timeout_s": PEER_TIMEOUT, "commit": git_commit(), "scenarios": {}}
    bad = []
    for scenario in SCENARIOS:
        with tempfile.TemporaryDirectory() as d:
            try:
                res = run_world(abort_world, args.ranks, kwargs={"scenario": scenario,
                                "note_dir": d}, backend=args.backend, timeout=180, env=env,
                                store="parent", allow_killed=True)
            except Exception as e:  # noqa: BLE001 - reported as this scenario's FAIL
                print(f"FAIL {scenario}: the world failed: {e}", flush=True)
                bad.append(scenario)
                record["scenarios"][scenario] = {"error": str(e)[-4000:]}
                continue
            with open(os.path.join(d, "killed")) as f:
                killed = float(f.read())
        survivors = [r for r in res if r is not None]
        detect = [r["caught"] - killed for r in survivors if "caught" in r]
        problems = [f"rank {r['me']}: {r['error']}" for r in survivors if r["error"]]
        problems += [f"rank {r['me']}: wrong all_reduce after shrink" for r in survivors
                     if not r["all_reduce_ok"]]
        problems += [f"rank {r['me']}: symmetric tensor not kept" for r in survivors
                     if not r["kept_ok"]]
        if len(survivors) != args.ranks - 1:
            problems.append(f"{len(survivors)} survivors, expected {args.ranks - 1}")
        if detect and max(detect) > PEER_TIMEOUT + 1:
            problems.append(f"RankLostError {max(detect):.2f} s after the SIGKILL "
                            f"(limit {PEER_TIMEOUT + 1:g} s)")
        entry = {"detect_s": detect, "recover_s": [r["done"] - killed for r in survivors],
                 "shrink_s": [r["shrink_s"] for r in survivors], "problems": problems,
                 "message": survivors[0].get("text", "") if survivors else ""}
        record["scenarios"][scenario] = entry
        line = (f"{scenario}: detect max {max(detect, default=float('nan')):.3f} s, "
                f"first correct all_reduce max {max(entry['recover_s'], default=0):.3f} s")
        print(("PASS " if not problems else "FAIL ") + line
              + ("" if not problems else "; " + "; ".join(problems)), flush=True)
        if problems:
            bad.append(scenario)
    if args.backend == "cuda":
        try:
            cost = run_world(cost_world, args.ranks, kwargs={"rounds": 200, "repeats": 5},
                             backend="cuda", timeout=240, env=env)[0]
            record["cost"] = cost
            print(f"PASS cost: ping-pong {cost['pingpong_us']:.1f} us without the abort "
                  f"check, {cost['pingpong_with_ctx_us']:.1f} us with it (per round trip); "
                  f"all_reduce eager {cost['all_reduce_8B_us']:.1f} us (8 B), "
                  f"{cost['all_reduce_65536B_us']:.1f} us (64 KiB)", flush=True)
        except Exception as e:  # noqa: BLE001 - reported as the cost's FAIL
            print(f"FAIL cost: {e}", flush=True)
            bad.append("cost")
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print("PASS" if not bad else f"FAIL: {', '.join(bad)}", flush=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
