#!/usr/bin/env bash
# The lead's one command on the 2xH200 machine (torch 2.11, triton 3.6, no downloads):
#
#   bash bench/gpu_suite.sh            # from the repository root; ~8 minutes
#
# 1. GPU correctness suite (pytest -m gpu)
# 2. full benchmark, eager and CUDA-graph, every op, 8 B .. 1 GiB -> bench/results/2xh200-w2.json
# 3. commlab.tune() + the tuned-auto check (auto within 5% of the best algorithm per size)
# Everything it writes is also copied to $OUT when set (the device tool brings $OUT back).
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/commlab-gpu-suite}
source bench/_steps.sh  # gpu_env, step TAG NAME SECONDS CMD..., STEPS, status
STAMP=$(mktemp)  # files written after this are this run's results
gpu_env gpu_suite.log
export COMMLAB_TUNING_DIR="$PWD/bench/results/tuning"
NGPU=${NGPU:-2}
RUN="$PY -m torch.distributed.run --standalone --nproc-per-node $NGPU"
SIZES=8,64,1KiB,8KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB,1GiB
step tests "gpu tests" 150 $PY -m pytest -m gpu -q -p no:cacheprovider -rs tests
step bench "bench eager+graph" 230 $RUN -m commlab.bench --sizes $SIZES --mode both --iters 20 \
  --no-progress --out bench/results
step tune "tune + auto check" 200 $RUN -m commlab.tuning --check --sizes $SIZES --iters 10 \
  --out bench/results
if [ -n "${OUT:-}" ]; then  # this run's records and tuning table, flat (the tool takes 8 files)
  find bench/results -type f -newer "$STAMP" -name '*.json' -exec cp {} "$OUT/" \; -print
fi
rm -f "$STAMP"
echo "gpu_suite: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
