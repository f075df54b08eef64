#!/usr/bin/env bash
# What one H200 can check (the nvidia-h200 kind; the 2-GPU checks are bench/gpu_checks.sh):
#
#   bash bench/gpu_one.sh        # from the repository root; logs and records to $OUT
#
# compile: every overlap kernel for sm_90 (registers, spills); smoke: every op x algorithm x
# dtype on a world of one rank against NCCL, the device language compiled, launch plans;
# tests: pytest -m gpu (the 2-GPU ones skip); eager: per-call host cost, commlab vs NCCL vs
# torch symm-mem, one rank; torch_backend: "cpu:gloo,cuda:commlab" vs NCCL, one rank.
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/commlab-gpu-one}
source bench/_steps.sh  # gpu_env, step TAG NAME SECONDS CMD..., STEPS, status
gpu_env one.log
RUN1="$PY -m torch.distributed.run --standalone --nproc-per-node 1"
step compile "kernels compiled for sm_90: registers, spills" 150 $PY bench/checks/compile_check.py
step smoke "smoke, one rank" 200 $RUN1 bench/checks/gpu_smoke.py
step tests "gpu tests" 300 $PY -m pytest -m gpu -q -p no:cacheprovider -rs tests
if [ -f bench/checks/gpu_eager_cost.py ]; then
  step eager "eager per-call cost, one rank" 150 $RUN1 bench/checks/gpu_eager_cost.py --out "$OUTDIR"
fi
step torch_backend "torch backend on cuda, one rank" 200 $RUN1 bench/torch_backend_bench.py \
  --device cuda --out "$OUTDIR/torch-backend-cuda-w1.json"
echo "gpu_one: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
