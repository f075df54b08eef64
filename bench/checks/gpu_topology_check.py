"""Record this GPU machine's topology and link bandwidth as commlab sample data.

    python bench/checks/gpu_topology_check.py OUT_DIR [--name 2xh200] [--ranks 2]

Writes into OUT_DIR:
  {name}-recorded.json    commlab.topology.discover() (NVML + sysfs), ranks mapped to GPUs
  topo-m.txt              `nvidia-smi topo -m` as printed, and
  topo-m-parsed.json      the same parsed by commlab's fallback parser
  linkbench-{name}.json   every ordered GPU pair, triton + memcpy (copy engine),
                          64 KiB..256 MiB
  nvlink-live.json        NVML per-link counters sampled at 10 Hz while all_reduce runs

Runs under plain python: the ranks are spawned by commlab.testing.run_world (no torchrun).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def busy_all_reduce(comm, seconds: float, nbytes: int) -> dict:
    """Keep NVLink busy with all_reduce for ``seconds``; return the call count."""
    import torch

    import commlab

    x = commlab.symmetric_empty((nbytes // 2,), torch.bfloat16)
    x.fill_(1.0)
    calls, t_end = 0, time.monotonic() + seconds
    while time.monotonic() < t_end:
        commlab.all_reduce(x)
        calls += 1
    comm.synchronize()
    return {"rank": comm.rank, "calls": calls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--name", default="2xh200")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    out = lambda f: os.path.join(args.out_dir, f)  # noqa: E731

    import torch

    from commlab import topology as T
    from commlab.testing import run_world
    from commlab.topology import _smi
    from commlab.topology._bench_result import LinkBenchResult
    from commlab.topology._remote import bench_and_info
    from commlab.topology.linkbench import GPU_SIZES

    if torch.cuda.device_count() < args.ranks:
        print(f"needs {args.ranks} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2

    # -- 1. topology: NVML (+ sysfs), and the topo -m fallback on the same machine ----------
    topo = T.discover()
    try:
        text = _smi.run_topo_m()
        open(out("topo-m.txt"), "w").write(text)
        _smi.parse_topo_m(text).save(out("topo-m-parsed.json"))
        print(text)
    except Exception as e:  # the NVML record is the main product; say why this one is missing
        print(f"nvidia-smi topo -m failed: {e}", file=sys.stderr)

    # -- 2. linkbench on a world of GPU ranks ---------------------------------------------
    t0 = time.time()
    outs = run_world(bench_and_info, args.ranks, args=(GPU_SIZES, args.iters,
                                                       ("triton", "memcpy")),
                     backend="cuda", timeout=600)
    topo = T.world_topology([o["info"] for o in outs], host=topo)
    topo.name = f"{args.name} (recorded)"
    topo.description = (f"Recorded by bench/checks/gpu_topology_check.py on {time.strftime('%Y-%m-%d')}"
                        f" through NVML and sysfs; ranks 0..{args.ranks - 1} on the GPUs listed.")
    topo.sources = ["NVML (nvidia-ml-py) on the machine", "Linux sysfs", "torch "
                    + torch.__version__]
    res = LinkBenchResult.from_rows([o["row"] for o in outs], topo)
    res.meta = {"recorded": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
                "seconds": round(time.time() - t0, 1)}
    for e in topo.edges:  # the measured copy-engine bandwidth at the largest size, per pair
        ranks = {v: k for k, v in topo.ranks.items()}
        if e.a in ranks and e.b in ranks and "memcpy" in res.methods:
            i, j = ranks[e.a], ranks[e.b]
            mat = res.matrix("memcpy")
            e.measured_gbps = round((mat[i][j] + mat[j][i]) / 2, 1)
    topo.save(out(f"{args.name}-recorded.json"))
    res.save(out(f"linkbench-{args.name}.json"))
    for m in res.methods:
        print(f"\n{m}, GB/s at {res.sizes[-1] >> 20} MiB (row reads column):")
        print(res.table(m))
        pct = res.percent_of_peak(m)
        print("% of peak:", [[None if p is None else round(p, 1) for p in row] for row in pct])

    # -- 3. live NVLink counters while all_reduce runs --------------------------------------
    live: dict = {"samples": []}
    try:
        from commlab.topology.nvlink_counters import NvlinkSampler

        sampler = NvlinkSampler(topo, lambda r: live["samples"].append(
            {"t": time.time(), "gbps": {"-".join(k): round(v, 2) for k, v in r.items()}}))
        sampler.start()
        box: dict = {}
        th = threading.Thread(target=lambda: box.update(r=run_world(
            busy_all_reduce, args.ranks, args=(4.0, 256 << 20), backend="cuda", timeout=300)))
        th.start()
        th.join()
        sampler.stop()
        live["calls"] = box.get("r")
        peak = max((max(s["gbps"].values(), default=0) for s in live["samples"]), default=0)
        live["max_edge_gbps"] = peak
        print(f"\nNVLink counters: {len(live['samples'])} samples, busiest edge {peak:.1f} GB/s")
    except Exception as e:
        live["error"] = repr(e)
        print(f"NVLink counter sampling failed: {e!r}", file=sys.stderr)
    json.dump(live, open(out("nvlink-live.json"), "w"), indent=1)
    print(f"\nwrote {sorted(os.listdir(args.out_dir))} to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
