#!/usr/bin/env bash
# One device call of this session's GPU checks, in order, under one 10-minute limit:
#   records  bench/checks/gpu_records_adapt.py (call records, their cost, a frozen
#            adaptive choice in a graph, profiler events) -> gpu-records-adapt.json;
#            then a one-rank probe: if a recording kernel cannot run, the later steps
#            run with COMMLAB_RECORDS=0 and say so
#   w2, w4   the shared-GPU suite (bench/gpu_shared.sh's steps)
#   eager    bench/eager_bench.py when it exists (issue 29)
#   STEPS="w2 w4" bash bench/gpu_session.sh
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/commlab-gpu-session}
source bench/_steps.sh
gpu_env session.log
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
  || echo "could not install commlab (the %%distributed check will fail to load it)"
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
if [ -f bench/eager_bench.py ]; then
  step eager "eager per-call times" 280 $PY bench/eager_bench.py --out "$OUTDIR"
fi
echo "gpu_session: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
