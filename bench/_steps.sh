# Sourced by the GPU scripts (bench/gpu_one.sh, gpu_checks.sh, gpu_suite.sh): the machine's
# rules and their step runner.
#   STEPS="tests bench" bash bench/gpu_suite.sh    runs only the steps tagged tests and bench
STEPS=${STEPS:-all}
status=0
step() {  # step TAG NAME SECONDS CMD...: run with a time limit, keep going, remember failures
  local tag=$1 name=$2 limit=$3; shift 3
  if [ "$STEPS" != all ] && [[ " $STEPS " != *" $tag "* ]]; then echo "=== $name: skipped"; return; fi
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -ne 0 ] && status=1
}

gpu_env() {  # gpu_env LOG: NVLink multicast off (the lent machines' rule), unbuffered
  # Python, everything this shell prints also teed to $OUTDIR/LOG; PY and PYTHONPATH set
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 COMMLAB_TIMEOUT=120
  mkdir -p "$OUTDIR"
  exec > >(tee -a "$OUTDIR/$1") 2>&1
  PY=${PYTHON:-python}
  if ls .whl/*.whl >/dev/null 2>&1; then  # the engine's wheels, carried (no downloads there)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))"
}
