#!/usr/bin/env bash
# Correctness on the 2xH200 machine, one command (the device tool; ~8 minutes):
#
#   bash bench/gpu_checks.sh      # from the repository root, wheels for the engine in .whl/
#
# 0. bench/checks/compile_check.py (registers/spills), bench/probes/gpu_gemm_variants.py (split tail
#    off/on vs cuBLAS on the overlap benchmark's local GEMMs)
#    bench/probes/gpu_rs_variants.py (gemm_rs: where its time goes, the epilogue's forms),
#    bench/probes/gpu_timing_regimes.py (STEPS=regimes: two ways of timing, and the SM clock)
# 1. bench/checks/gpu_smoke.py under torchrun: every op x algorithm x dtype x size vs NCCL,
#    the device language compiled, heap lifetime, back-to-back calls
# 2. pytest -m gpu (bench, topology, linkbench, overlap)
# 3. python -m commlab.bench.overlap: ag_gemm / gemm_rs checked, then timed side by side (~4 min)
# 4. bench/checks/gpu_quickstart_check.py: the magics on a CUDA world (needs ipyparallel & co.,
#    installed from .whl/ when present; list in that script)
# 5. bench/checks/gpu_topology_check.py: recorded topology + linkbench matrix + NVLink counters
# Logs and the topology files go to $OUT when set (the device tool brings $OUT back).
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/commlab-gpu-checks}
mkdir -p "$OUTDIR/topo"
source bench/_steps.sh  # gpu_env, step TAG NAME SECONDS CMD..., STEPS, status
gpu_env checks.log
step compile "kernels compiled for sm_90: registers, spills" 120 $PY bench/checks/compile_check.py "$OUTDIR/ir"
step gemm_tail "Triton GEMM, split tail off/on vs cuBLAS (one GPU)" 200 \
  $PY bench/probes/gpu_gemm_variants.py --out "$OUTDIR"
step rs_forms "gemm_rs: the own tiles' epilogue forms, timed and traced" 400 \
  $PY -m torch.distributed.run --standalone --nproc-per-node 2 bench/probes/gpu_rs_variants.py \
  --out "$OUTDIR"
step regimes "timing regimes: a window per impl vs interleaved, with the SM clock" 300 \
  $PY -m torch.distributed.run --standalone --nproc-per-node 2 bench/probes/gpu_timing_regimes.py \
  --out "$OUTDIR"
step smoke "smoke" 170 $PY -m torch.distributed.run --standalone --nproc-per-node 2 bench/checks/gpu_smoke.py
step tests "gpu tests" 450 $PY -m pytest -m gpu -q -p no:cacheprovider -rs tests
step overlap "overlap check + benchmark" 280 $PY -m torch.distributed.run --standalone \
  --nproc-per-node 2 -m commlab.bench.overlap --out "$OUTDIR" ${OVERLAP_ARGS:-}
step overlap_test "gpu overlap test alone" 450 $PY -m pytest -m gpu -q -s -p no:cacheprovider \
  -rs tests/test_overlap_gpu.py
step quickstart "quickstart (magics, cuda)" 110 $PY bench/checks/gpu_quickstart_check.py --ranks 2
step nvml "NVML counter probe" 100 $PY bench/checks/nvml_probe.py
step topology "topology + linkbench" 110 $PY bench/checks/gpu_topology_check.py "$OUTDIR/topo"
echo "gpu_checks: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
