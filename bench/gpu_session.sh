#!/usr/bin/env bash
# One device call of this session's GPU checks, in order, under one 10-minute limit:
#   records  bench/checks/gpu_records_adapt.py (call records, their cost, a frozen
#            adaptive choice in a graph, profiler events) -> gpu-records-adapt.json;
#            then a one-rank probe: if a recording kernel cannot run, the later steps
#            run with COMMLAB_RECORDS=0 and say so
#   w2, w4   the shared-GPU suite (bench/gpu_shared.sh's steps)
#   launch   bench/checks/gpu_eager_launch.py (the eager plan's launcher tiers, issue 29)
#   eager1   bench/eager_bench.py, a world of one (issue 29's goal table)
#   eager2   bench/eager_bench.py --ranks 2 (two ranks sharing the GPU)
#   tbo1 tbo2  bench/checks/gpu_torch_backend_overhead.py, 1 and 2 ranks (issue 29 item 3)
#   floor    bench/probes/torch_dist_floor.py --device cuda --commlab (what torch's dist.*
#            costs on backends that do nothing, beside the commlab backend)
#   adapt    bench/checks/gpu_adapt_switch.py (algorithm changes between calls, issue 30)
#   abort    bench/checks/gpu_elastic_abort.py --ranks 2 (the abort word in GPU spins)
#   adaptb   bench/adapt_bench.py --backend cuda --ranks 2 (online selection while
#            conditions change, issue 30 item 3)
#   adaptc   bench/adapt_bench.py --backend cpu --ranks 4 on this host's quiet cores (the CPU
#            world of issue 30 item 3, judged where the cores outnumber the ranks);
#            ADAPTC_RUNS=N runs it N times (-r1..-rN: one run is one draw of a wide spread)
#   native   bench/probes/gpu_eager_breakdown.py with the C twin on and off (COMMLAB_NATIVE
#            1 / 0: where an eager call's host microseconds go), then the shared-GPU suite on
#            2 ranks with it on (what must pass before COMMLAB_NATIVE's default includes GPUs)
#   STEPS="w2 w4" bash bench/gpu_session.sh   (default: every step; about 15 minutes)
#   COMMLAB_COMMIT=$(git rev-parse --short HEAD) as well: the device's copy of the tree may
#   carry a stale .git, and the records name the commit they ran on
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/commlab-gpu-session}
source bench/_steps.sh
gpu_env session.log
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
  || echo "could not install commlab (the %%distributed check will fail to load it)"
ONE="env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1"
step native "eager host cost, C twin on" 100 $ONE MASTER_PORT=29541 COMMLAB_NATIVE=1 \
  $PY bench/probes/gpu_eager_breakdown.py --iters 10000 --reps 5 --out "$OUTDIR/eager-breakdown-native.json"
step native "eager host cost, C twin off" 100 $ONE MASTER_PORT=29542 COMMLAB_NATIVE=0 \
  $PY bench/probes/gpu_eager_breakdown.py --iters 10000 --reps 5 --out "$OUTDIR/eager-breakdown-python.json"
# one file for both (the device returns at most 8 files a call)
$PY - "$OUTDIR" <<'MERGE' || true
import json, os, sys
d = sys.argv[1]
parts = {k: os.path.join(d, f"eager-breakdown-{k}.json") for k in ("native", "python")}
if all(os.path.exists(p) for p in parts.values()):
    both = {k: json.load(open(p)) for k, p in parts.items()}
    json.dump(both, open(os.path.join(d, "eager-breakdown.json"), "w"), indent=1)
    for p in parts.values():
        os.unlink(p)
MERGE
step native "suite, 2 ranks, C twin on" 170 env COMMLAB_NATIVE=1 $PY bench/checks/gpu_shared_suite.py \
  --ranks 2 --timeout 150 --out "$OUTDIR/gpu-shared-w2-native.json"
step launch "eager plan launcher tiers" 100 $PY bench/checks/gpu_eager_launch.py \
  --out "$OUTDIR/h200-eager-launch-check.json"
step eager1 "eager per-call times, one rank" 220 $PY bench/eager_bench.py --out "$OUTDIR"
step records "call records and online selection" 150 $PY bench/checks/gpu_records_adapt.py \
  --out "$OUTDIR/gpu-records-adapt.json"
# a world of one with records on: if its kernels cannot run, the suites go without records
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 timeout 120 $PY -c "
import torch, commlab
c = commlab.init(backend='cuda'); x = torch.ones(4099, device=c.device)
assert float(commlab.all_reduce(x)[0]) == 1.0; print('records probe: ok')" \
  || { echo "records probe FAILED: the suites run with COMMLAB_RECORDS=0"; export COMMLAB_RECORDS=0; }
step w2 "suite, 2 ranks" 170 $PY bench/checks/gpu_shared_suite.py --ranks 2 --timeout 150 \
  --out "$OUTDIR/gpu-shared-w2.json"
step w4 "suite, 4 ranks" 200 $PY bench/checks/gpu_shared_suite.py --ranks 4 --timeout 180 \
  --out "$OUTDIR/gpu-shared-w4.json"
step tbo1 "torch backend per call, one rank" 60 $PY bench/checks/gpu_torch_backend_overhead.py \
  --ranks 1 --out "$OUTDIR/torch-backend-overhead-gpu-w1.json"
step floor "the floor torch puts under dist.all_reduce" 120 env MASTER_PORT=29631 \
  $PY bench/probes/torch_dist_floor.py --device cuda --commlab --iters 10000 --reps 5 \
  --out "$OUTDIR/torch-dist-floor-cuda.json"
step tbo2 "torch backend per call, 2 ranks" 90 $PY bench/checks/gpu_torch_backend_overhead.py \
  --ranks 2 --iters 10 --reps 5 --out "$OUTDIR/torch-backend-overhead-gpu-w2.json"
step eager2 "eager per-call times, 2 ranks sharing the GPU" 120 $PY bench/eager_bench.py \
  --ranks 2 --out "$OUTDIR"
step adapt "algorithm changes between calls" 150 $PY bench/checks/gpu_adapt_switch.py \
  --out "$OUTDIR/gpu-adapt-switch.json"
step abort "a rank lost while the others spin" 120 $PY bench/checks/gpu_elastic_abort.py \
  --ranks 2 --out "$OUTDIR/gpu-elastic-abort-w2.json"
step adaptb "online selection while conditions change, 2 ranks" 200 $PY bench/adapt_bench.py \
  --backend cuda --ranks 2 --out "$OUTDIR/adapt-cuda-w2.json"
for i in $(seq 1 "${ADAPTC_RUNS:-1}"); do  # ADAPTC_RUNS=3: three runs, one distribution
  suffix=$([ "${ADAPTC_RUNS:-1}" -gt 1 ] && echo "-r$i")
  step adaptc "online selection while conditions change, 4 CPU ranks${suffix}" 450 \
    env COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 $PY bench/adapt_bench.py --backend cpu --ranks 4 \
    --notes "commit ${COMMLAB_COMMIT:-?}; the device host's $(nproc) cores, nothing else running" \
    --out "$OUTDIR/adapt-cpu-w4-devicehost${suffix}.json"
done
echo "gpu_session: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
