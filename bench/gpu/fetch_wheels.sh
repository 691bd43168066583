#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels the offline GPU check needs on the lent GPU
# machine (Python 3.12, manylinux x86_64; shared/reference/GPU_MACHINE.md), into
# bench/gpu/wheels/ (git-ignored; about 14 MB, under the 64 MiB carry limit): exllamav2 and its
# missing deps, exllamav3 1.6.5 and its missing deps (marisa-trie, llguidance; pydantic is
# assumed there), gguf.
# Usage: bash bench/gpu/fetch_wheels.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="$HERE/wheels"
mkdir -p "$DEST"
for req in exllamav2==0.3.2 fastparquet cramjam websockets gguf exllamav3==1.6.5 marisa-trie llguidance; do
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "$req"
done
du -sh "$DEST"
