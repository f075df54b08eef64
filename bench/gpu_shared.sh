#!/usr/bin/env bash
# The one-GPU regression suite (issue 26): worlds of 2 and 4 ranks sharing the GPU(s)
# (rank r on device r % device_count; unchanged on a machine with more GPUs):
#
#   bash bench/gpu_shared.sh              # from the repository root; logs and records to $OUT
#   STEPS=w2 bash bench/gpu_shared.sh     # one step (w2 w4 torch tests), e.g. to fit a 10-minute call
#
# w2, w4: bench/checks/gpu_shared_suite.py (every collective x algorithm x dtype x odd sizes
# against gloo, CUDA graphs, ag_gemm/gemm_rs, user cl kernels, a planted hang released by
# a peer, DDP on the "commlab" backend, a %%distributed cell, all_reduce latency) ->
# $OUT/gpu-shared-w2.json, gpu-shared-w4.json (commit them as bench/results/); torch:
# tests/torch_suite on cuda, world 2 -> torch-suite-cuda-w2.json; tests:
# pytest -m gpu (the suite's own GPU test is the w2 step, deselected there). The notebook
# check needs ipyparallel & co. carried as wheels in .whl/ (gpu_env installs them).
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/commlab-gpu-shared}
source bench/_steps.sh  # gpu_env, step TAG NAME SECONDS CMD..., STEPS, status
gpu_env shared.log
# %load_ext commlab needs commlab.magics, which only an install maps (top-level magics/)
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
  || echo "could not install commlab (the %%distributed check will fail to load it)"
for n in 2 4; do
  step "w$n" "suite, $n ranks" 570 $PY bench/checks/gpu_shared_suite.py --ranks "$n" \
    --out "$OUTDIR/gpu-shared-w$n.json"
done
# PyTorch's own distributed tests on "cpu:gloo,cuda:commlab", ranks sharing the GPU (issue 28)
step torch "torch's distributed tests on cuda" 420 $PY -m tests.torch_suite.run --device cuda \
  --world 2 --timeout 40 --json "$OUTDIR/torch-suite-cuda-w2.json"
step tests "gpu tests" 300 $PY -m pytest -m gpu -q -p no:cacheprovider -rs tests \
  --deselect tests/test_gpu_shared_suite.py::test_whole_suite_passes_on_two_ranks_of_the_gpus
echo "gpu_shared: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
