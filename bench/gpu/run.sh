#!/usr/bin/env bash
# One stage of the offline GPU check, one command of under 10 minutes on a GPU machine without
# network (docs/gpu.md gives the sequence): installs the carried wheels (bench/gpu/wheels/, see
# fetch_wheels.sh; a few seconds, so every stage does it: a fresh machine may have come up; env
# also imports every needed package and stops on a missing one), then runs
# `python -m bench.gpu.kit.check --stage STAGE...` from this checkout. Rows go to $OUT (or
# bench/gpu/out, git-ignored) as each finishes; state (models, extensions, rows) stays in the
# git-ignored bench/gpu/.work/ for the next command on the same machine.
# Usage: bash bench/gpu/run.sh STAGE [STAGE...] [-- kit.check args...]
#   stages: env ext models exl2-a exl2-b llamacpp exl3 table (or all: every stage, > 10 minutes)
#   (bash bench/gpu/lease.sh runs what is not yet verified, in one command)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="$ROOT/bench/gpu/wheels"
stages=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do stages+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#stages[@]} -gt 0 ] || { echo "usage: bash bench/gpu/run.sh STAGE [STAGE...] [-- args]" >&2; exit 2; }
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PY" -m bench.gpu.kit.carry install --wheels "$WHEELS"
fi
if [ "${stages[0]}" = "env" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "$PY" -m bench.gpu.kit.carry env
fi
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/bench/gpu/.work/torch_extensions}"
exec "$PY" -m bench.gpu.kit.check --stage "${stages[@]}" \
  --out "${OUT:-$ROOT/bench/gpu/out}" "$@"
