"""GPU wait records, one GPU, one rank: a kernel whose programs wait on flags nobody sets
must show, read from the host while it spins, each program id with its flag's offset and
value; writing the flags from a side stream releases it; the records clear. Then the
eager one-shot all_reduce per call at 8 B-64 KiB (its waits take the record path).

    python bench/checks/gpu_wait_records.py        # prints PASS or FAIL (exit 0 / 1)

The kernel not released within 10 s of the write, or anything hung 120 s: FAIL, and the
process ends (the spinning kernel with it).
"""

from __future__ import annotations

import os
import sys
import time


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
             "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(k, v)
if "MASTER_PORT" not in os.environ:
    os.environ["MASTER_PORT"] = _free_port()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import commlab  # noqa: E402
import commlab.language as cl  # noqa: E402
from commlab.racecheck import blocked_waits, wait_graph_text  # noqa: E402
from commlab.runtime import wait_records  # noqa: E402

PROGRAMS = 4


@triton.jit
def stuck_kernel(flag, ctx):
    """Program p waits for flag[p] >= p + 1, recording it; program p then writes p."""
    p = tl.program_id(0)
    cl.wait(flag + p, p + 1, ctx)
    tl.store(flag + 8 + p, p)


def _until(cond, limit: float):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        got = cond()
        if got:
            return got
        time.sleep(0.01)
    return None


def check(comm) -> list[str]:
    bad = []
    flag = commlab.symmetric_zeros((16,), torch.int32)
    torch.cuda.synchronize()
    base = comm.heap.bases[comm.rank]
    done = torch.cuda.Event()
    stuck_kernel[(PROGRAMS,)](flag, comm.context)
    done.record()
    recs = _until(lambda: (r := wait_records.now(comm)) and len(r) == PROGRAMS and r, 10.0)
    print("records while spinning:", recs)
    want = [(p, flag.data_ptr() + 4 * p, p + 1) for p in range(PROGRAMS)]
    got = sorted((r["program"], r["addr"], r["wants"]) for r in (recs or []))
    if got != want:
        bad.append(f"records {got} != {want}")
    nodes = blocked_waits({"flag": flag})
    text = wait_graph_text(nodes, comm.world_size)
    print(text)
    for p in range(PROGRAMS):
        off = flag.data_ptr() - base + 4 * p
        if not any(n["program"] == p and n["flag_offset"] == off and n["wants"] == p + 1
                   and n.get("flag") == f"flag[{p}]" for n in nodes):
            bad.append(f"no graph node for program {p} at offset {off:#x} (flag[{p}])")
    if done.query():
        bad.append("the kernel finished before its flags were set")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # runs beside the spinning kernel
        flag[:PROGRAMS].fill_(PROGRAMS + 1)
    if not _until(done.query, 10.0):
        print("FAIL: the kernel was not released by the side stream's write")
        sys.stdout.flush()
        os._exit(1)
    torch.cuda.synchronize()
    if flag[8:8 + PROGRAMS].tolist() != list(range(PROGRAMS)):
        bad.append(f"programs did not run past the wait: {flag[8:8 + PROGRAMS].tolist()}")
    left = wait_records.now(comm)
    if left:
        bad.append(f"records not cleared after the waits: {left}")
    x = torch.ones(1024, device=comm.device)
    if not torch.equal(commlab.all_reduce(x, algorithm="one_shot"), x):
        bad.append("one_shot all_reduce wrong after the check")
    return bad


def timing(comm) -> None:
    print("one_shot all_reduce eager, bf16, per call (2000 calls):")
    for nbytes in (8, 64, 512, 4096, 32768, 65536):
        x = torch.ones(max(1, nbytes // 2), device=comm.device, dtype=torch.bfloat16)
        for _ in range(20):
            commlab.all_reduce(x, algorithm="one_shot")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            commlab.all_reduce(x, algorithm="one_shot")
        torch.cuda.synchronize()
        print(f"  {nbytes:>6} B: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us")


def main() -> int:
    import threading

    def watchdog():
        time.sleep(120)
        print("FAIL: watchdog (120 s): something hung")
        sys.stdout.flush()
        os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    comm = commlab.init(backend="cuda")
    bad = check(comm)
    timing(comm)
    print("PASS" if not bad else "FAIL: " + "; ".join(bad))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
