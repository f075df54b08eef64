"""Check the notebook engine on a machine with 2 GPUs: run with plain `python`.

    python bench/checks/gpu_quickstart_check.py [--ranks 2]

Starts the magics in an IPython InteractiveShell with ``%dist_start -n 2 --backend cuda``,
then runs a collective cell, a failing cell, a hang cell with ``--timeout`` and a
collective again (the world must have recovered), and prints what happened. Needs
ipyparallel, pyzmq (and their pure-Python dependencies) in the environment.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback

# NVLink multicast is off on our GPU machines: never let anything try it
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def step(name, fn) -> bool:
    print(f"\n=== {name}", flush=True)
    t0 = time.monotonic()
    try:
        fn()
    except BaseException as e:  # report, don't stop: we want every step's outcome
        render = getattr(e, "_render_traceback_", None)
        text = "\n".join(render()) if render else traceback.format_exc()
        print(f"--> raised {type(e).__name__} after {time.monotonic() - t0:.1f} s:\n{text}")
        return False
    print(f"--> ok in {time.monotonic() - t0:.1f} s")
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "commlab")
    run = lambda code, line="": ip.run_cell_magic("distributed", line, code)
    results = {}
    start = f"-n {args.ranks} --backend cuda"
    results["start"] = step(f"%dist_start {start}",
                            lambda: ip.run_line_magic("dist_start", start))
    if not results["start"]:
        raise SystemExit(1)
    ip.run_line_magic("dist_status", "")
    results["collective"] = step("collective cell", lambda: run(
        "x = torch.full((1 << 20,), float(rank + 1), device=comm.device, dtype=torch.bfloat16)\n"
        "y = commlab.all_reduce(x)\n"
        "torch.cuda.synchronize()\n"
        "print('all_reduce', y[:4].float().tolist(), 'on', comm.device, comm.backend)\n"))
    results["triton kernel in cell"] = step("@triton.jit defined in the cell", lambda: run(
        "@triton.jit\n"
        "def scale(x_ptr, f, N: tl.constexpr):\n"
        "    o = tl.arange(0, N)\n"
        "    tl.store(x_ptr + o, tl.load(x_ptr + o) * f)\n"
        "z = torch.ones(16, device=comm.device)\n"
        "scale[(1,)](z, rank + 2, 16)\n"
        "print('kernel', z[:2].tolist())\n"))
    failed = step("failing cell (expect ZeroDivisionError on rank 1)", lambda: run(
        "if rank == 1:\n    1 / 0\n"))
    results["failing cell raised"] = not failed
    hang = step("hang cell with --timeout 10 (expect a hang report)", lambda: run(
        "x = torch.ones(1024, device=comm.device)\n"
        "if rank == 0:\n    commlab.all_reduce(x)\n", "--timeout 10"))
    results["hang reported"] = not hang
    box = {}

    def plain_hang():
        try:
            run("import time\nif rank == 0:\n    time.sleep(60)\n", "--timeout 5")
        except Exception as e:  # the HangError is the expected outcome
            box["report"] = str(e)
            raise
    step("plain-Python hang (rank 0 sleeps; its stack must show the sleep)", plain_hang)
    results["stack of a sleeping rank"] = "time.sleep" in box.get("report", "")
    results["recovered"] = step("collective after the hang", lambda: run(
        "y = commlab.all_reduce(torch.ones(8, device=comm.device))\n"
        "torch.cuda.synchronize()\nprint('after recovery', y[:2].tolist())\n"))
    results["stop"] = step("%dist_stop", lambda: ip.run_line_magic("dist_stop", ""))
    print("\n=== summary")
    for k, v in results.items():
        print(f"  {'PASS' if v else 'FAIL'}  {k}")
    raise SystemExit(0 if all(results.values()) else 1)


if __name__ == "__main__":
    main()
