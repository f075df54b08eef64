#!/usr/bin/env bash
# The README's test command: install commlab with its test extras (torch pinned to the
# CPU build), lint and type-check, and run the unit tests, the notebooks (nbval) and the
# browser test; tests marked slow are left out (-m slow runs just those).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
export COMMLAB_BACKEND=cpu OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python -m ruff check .   # lint (pyproject.toml [tool.ruff])
python -m mypy           # types (pyproject.toml [tool.mypy])
# Two workers, one file (one notebook) per worker at a time: most tests wait on spawned
# ranks, JupyterLab or a timeout, so two share two cores well (PYTEST_WORKERS=0: serial).
python -m pytest -q -p no:cacheprovider --timeout=600 -n "${PYTEST_WORKERS:-2}" --dist loadfile \
  -m "not slow" tests notebooks --nbval-lax --durations=25 "$@"
