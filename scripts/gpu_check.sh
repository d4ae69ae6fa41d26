#!/usr/bin/env bash
# The prepared GPU check (bench/gpu_check.py): every GPU figure, a part per call, each step
# time-boxed, rows and traces written to OUT as they come.
#   bash scripts/gpu_check.sh OUT              on a lent GPU machine: its image (python 3.12,
#                                              jax 0.11, CUDA 13) plus the wheels carried in
#                                              .whl/ and the peer in .peers/ (gpu_prepare.sh)
#   bash scripts/gpu_check.sh --cpu-smoke OUT  the same steps at tiny shapes on this CPU
# Flags after OUT go to bench/gpu_check.py (--part N: one of five parts, every part without it;
# --only STEP ...; --budget SECONDS for the whole run; --max-trace-mb M).
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=""
if [ "${1:-}" = "--cpu-smoke" ]; then SMOKE="--cpu-smoke"; shift; fi
OUT=${1:?usage: bash scripts/gpu_check.sh [--cpu-smoke] OUT [--only STEP ...]}
shift
mkdir -p "$OUT"
if [ -z "$SMOKE" ]; then
    # shellcheck source=gpu_setup.sh
    . scripts/gpu_setup.sh || { echo "error: the carried wheels did not install (.whl/: run scripts/gpu_prepare.sh here first)"; exit 1; }
fi
PY=${PYTHON:-python3}
[ -n "$SMOKE" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" bench/gpu_check.py $SMOKE "$OUT" "$@"
