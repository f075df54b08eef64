#!/usr/bin/env bash
# The README's demo command: install commlab and run the all-reduce demo on 4 CPU ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e .
COMMLAB_BACKEND=cpu python -m torch.distributed.run --nproc-per-node "${RANKS:-4}" -m commlab.demo
