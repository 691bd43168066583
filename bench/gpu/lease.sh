#!/usr/bin/env bash
# The offline GPU check in ONE command of a lent machine (under its 10-minute limit), for a
# session whose whole device time (15 minutes, start-up included) buys about one such command.
# run.sh's stages in an order that overlaps the slow parts: the FIRST engine's CUDA extension
# builds with every core, then the other's builds in the background (nice, fewer jobs) while
# the first's conversions and rows use the GPU; the other's conversions and rows run if its
# build finished, then the llama.cpp rows (skipped without a CUDA llama-cpp-python) and the
# table. Every phase is cut to what is left of TOTAL_S (default 560 s) so the table and the
# logs are always written: $OUT gets rows.jsonl, gpu_check.md/.json, environment.json,
# lease.log and logs.tgz (every step's and trial's log, no model files).
# Measured on an H200 (2026-11-26): exllamav2's extension 101 s with 16 jobs; exllamav3's
# kernels did not finish in 317 s with 10 niced jobs beside the exllamav2 rows, so one lease
# holds the rows of one of the two: FIRST picks which (exllamav3 by default: exllamav2's rows
# are in bench/results/gpu/). A second command on the same warm machine goes on from .work.
# Usage (device run, carry bench/gpu/wheels): [FIRST=exllamav2] bash bench/gpu/lease.sh
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUTDIR="${OUT:-$ROOT/bench/gpu/out}"
WORK="$ROOT/bench/gpu/.work"
TOTAL="${TOTAL_S:-560}"
FIRST="${FIRST:-exllamav3}"
case "$FIRST" in
  exllamav3) SECOND=exllamav2 ;;
  exllamav2) SECOND=exllamav3 ;;
  *) echo "FIRST must be exllamav2 or exllamav3, not '$FIRST'" >&2; exit 2 ;;
esac
mkdir -p "$OUTDIR" "$WORK"
exec > >(tee -a "$OUTDIR/lease.log") 2>&1
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="$WORK/torch_extensions" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
left() { echo $(( TOTAL - SECONDS )); }
stamp() { echo "== lease t=${SECONDS}s: $*"; }
check() { python3 -m autotune.tools.gpu_check --out "$OUTDIR" --timeout 120 "$@"; }

rows_of() { if [ "$1" = exllamav2 ]; then echo "exl2-a exl2-b"; else echo "exl3"; fi; }
ext_cap() { if [ "$1" = exllamav2 ]; then echo 260; else echo 420; fi; }

cap="$(ext_cap "$FIRST")"
stamp "$FIRST: environment and extension (at most $cap s)"
bash "$HERE/run.sh" env ext -- --engines "$FIRST" --total-s "$(( $(left) < cap ? $(left) : cap ))"

stamp "$SECOND: extension in the background"
(MAX_JOBS=10 nice -n 5 python3 -m autotune.tools.gpu_check --stage ext --engines "$SECOND" \
  --out "$WORK/bg" --total-s "$(( $(left) - 120 ))" > "$WORK/bg-ext.log" 2>&1) &
bg=$!

stamp "$FIRST: conversions and rows (leaving 130 s)"
# shellcheck disable=SC2046 # the row stages are words
check --stage models $(rows_of "$FIRST") --engines "$FIRST" --total-s "$(( $(left) - 130 ))"

stamp "waiting for $SECOND's extension"
wait "$bg"
cat "$WORK/bg-ext.log"
if grep -q "\"$SECOND\": \"\"" "$WORK/bg-ext.log"; then
  stamp "$SECOND: conversions and rows"
  # shellcheck disable=SC2046
  check --stage models $(rows_of "$SECOND") --engines exllamav2 exllamav3 --total-s "$(( $(left) - 20 ))"
else
  stamp "$SECOND's extension is not ready: its rows stay as they were"
fi
stamp "table"
check --stage llamacpp table
( cd "$WORK" && find . -maxdepth 3 \( -name '*.log' -o -name '*.json' \) -size -4M -print0 \
  | tar czf "$OUTDIR/logs.tgz" --null -T - ) || true
stamp "done"
