#!/usr/bin/env bash
# The GPU lease in ONE command (a device `run`, carrying bench/gpu/wheels, bench/gpu/tabbyAPI,
# bench/gpu/llama.cpp and bench/gpu/gguf, all made here by bench/gpu/prepare.sh):
#   1. installs the carried wheels (pip, no index) and imports every package the kit needs
#      (bench.gpu.kit.carry env, seconds); a missing one stops the lease here, with one
#      line naming it, before any build;
#   2. runs what bench/results/gpu/rows.jsonl has not verified yet, in order: ExLlamaV3,
#      TabbyAPI main with the exported config, llama.cpp on CUDA, ExLlamaV2's leftovers
#      (bench.gpu.kit.lease), writing rows.jsonl, gpu_check.md/.json and logs.tgz into
#      $OUT after every step, so a call cut off at its limit returns what it finished.
# A second command on the same warm machine goes on (state in bench/gpu/.work). With no GPU it
# is the kit's dry run: the same steps, the GPU ones skipped and said so, exit 0.
# Usage: [TOTAL_S=540] [STEPS="tabby llamacpp"] [LEASE_WORK=DIR] bash bench/gpu/lease.sh
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUTDIR="${OUT:-$ROOT/bench/gpu/out}"
WORK="${LEASE_WORK:-$ROOT/bench/gpu/.work}"
TOTAL="${TOTAL_S:-540}"
mkdir -p "$OUTDIR" "$WORK"
exec > >(tee -a "$OUTDIR/lease.log") 2>&1
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="$WORK/torch_extensions" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
echo "== lease t=${SECONDS}s: environment"
if command -v nvidia-smi > /dev/null && [ -e /dev/nvidia0 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
  python3 -m bench.gpu.kit.carry install || { echo "lease stopped: the carried wheels do not install"; exit 2; }
  python3 -m bench.gpu.kit.carry env || { echo "lease stopped: a needed package is missing"; exit 2; }
else
  echo "dry run: no GPU; the wheels are for the lent machine's Python 3.12, not installed here"
  python3 -m bench.gpu.kit.carry env --soft
fi
# shellcheck disable=SC2086 # STEPS is a list of words
python3 -m bench.gpu.kit.lease --total-s "$(( TOTAL - SECONDS ))" --out "$OUTDIR" --work "$WORK" \
  ${STEPS:+--steps $STEPS}
echo "== lease t=${SECONDS}s: done"
