# Sourced by bench/gpu_checks.sh and bench/gpu_suite.sh: their step runner.
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
