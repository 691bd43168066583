#!/usr/bin/env bash
# Everything the next GPU lease carries, prepared here (with network) into git-ignored folders
# of bench/gpu/ (never committed), then checked:
#   tabbyAPI/   TabbyAPI main's source (a git dir: TABBY_SRC, default the fetch tool's mirror)
#   tabbyAPI-exl2/  its exl2-checkpoint branch (TabbyAPI's last exllamav2 version)
#   wheels/     every wheel that machine lacks (fetch_wheels.sh; rewrites bench/gpu/carry.json)
#   llama.cpp/  llama.cpp from llama-cpp-python's sdist, trimmed to the llama-server build
#   gguf/       a tiny Llama GGUF and a tiny MoE GGUF that llama.cpp loads
# The lock's closure is checked as it is written (fetch_wheels.sh exits 2 on a gap); then the
# venv check (bench.gpu.kit.venv_check): TabbyAPI's and the carried wheels' modules import in a
# clean Python 3.12 venv made only of the carried wheels and the machine's packages (torch
# left out). Last, the carry list's size (at most 64 MiB per device call).
# Usage: [TABBY_SRC=DIR] [LLAMA_CPP_PYTHON=0.3.36] bash bench/gpu/prepare.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"
TABBY_SRC="${TABBY_SRC:-/work/.mirror/theroyallab+tabbyAPI/repo}"
py() { python3 -m "$@"; }
py bench.gpu.kit.sources tabby "$TABBY_SRC"
py bench.gpu.kit.sources tabby "$TABBY_SRC" --ref exl2-checkpoint --dest "$HERE/tabbyAPI-exl2"
bash "$HERE/fetch_wheels.sh"
py bench.gpu.kit.sources llama ${LLAMA_CPP_PYTHON:+--version "$LLAMA_CPP_PYTHON"}
py bench.gpu.kit.sources gguf
py bench.gpu.kit.venv_check
du -sh "$HERE/wheels" "$HERE/tabbyAPI" "$HERE/llama.cpp" "$HERE/gguf"
du -sc "$HERE/wheels" "$HERE/tabbyAPI" "$HERE/llama.cpp" "$HERE/gguf" | tail -1 \
  | awk '{ printf "carry: %.1f MiB of 64\n", $1 / 1024 }'
