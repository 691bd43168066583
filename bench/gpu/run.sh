#!/usr/bin/env bash
# The offline GPU check in one command, on a GPU machine without network (docs/gpu.md):
# installs the carried wheels (bench/gpu/wheels/, see fetch_wheels.sh), then runs
# `python -m autotune.tools.gpu_check` from this checkout and writes the table under $OUT
# (or bench/results/gpu). Extra arguments go to gpu_check (e.g. --gguf-converter PATH).
# Usage: bash bench/gpu/run.sh [gpu_check args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="$ROOT/bench/gpu/wheels"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PY" -m pip install --no-index --no-deps --quiet "$WHEELS"/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m autotune.tools.gpu_check --out "${OUT:-$ROOT/bench/results/gpu}" "$@"
