#!/usr/bin/env bash
# Fetch, here (with network), every wheel the lent GPU machine lacks (Python 3.12, Linux x86_64:
# shared/reference/GPU_MACHINE.md) into bench/gpu/wheels/ (git-ignored) and rewrite the
# committed lock bench/gpu/carry.json: exllamav2, exllamav3, gguf and the dependencies of
# TabbyAPI main and exl2-checkpoint (from bench/gpu/tabbyAPI*/pyproject.toml when prepare.sh
# has put them there, else from the lock's roots), with everything they require that the
# machine lacks, down to the leaves (bench.gpu.kit.carry; pydantic among them).
# Usage: bash bench/gpu/fetch_wheels.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
args=(lock --wheels "$HERE/wheels")
[ -f "$HERE/tabbyAPI/pyproject.toml" ] && args+=(--tabby "$HERE/tabbyAPI")
[ -f "$HERE/tabbyAPI-exl2/pyproject.toml" ] && args+=(--tabby-exl2 "$HERE/tabbyAPI-exl2")
rm -rf "$HERE/wheels"
cd "$ROOT" && python3 -m bench.gpu.kit.carry "${args[@]}"
du -sh "$HERE/wheels"
