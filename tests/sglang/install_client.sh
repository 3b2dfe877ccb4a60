#!/usr/bin/env bash
# Installs SGLang's *frontend client* (test-only) so that tests/server/test_sglang_client.py can run
# an @sgl.function program through sgl.RuntimeEndpoint against `radixagent serve`.
# Per shared/notes/sglang.md: sglang itself and a few pure-Python packages, each with --no-deps,
# on top of torch, transformers, requests and numpy (already in the product venv). Never the CUDA stack.
# Usage: bash tests/sglang/install_client.sh [VENV_DIR]   (default: .venv of the repository)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${1:-$ROOT/.venv}"
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"
test -x "$PIP" || { echo "no pip at $PIP (run 'make setup' first)" >&2; exit 2; }

if "$PY" -c "import sglang as sgl; sgl.function; sgl.RuntimeEndpoint" 2>/dev/null; then
    echo "sglang client already importable in $VENV"; exit 0
fi
"$PIP" install -q --no-deps sglang==0.5.23
"$PIP" install -q --no-deps orjson psutil pybase64 triton pillow starlette msgspec pyzmq ipython \
    traitlets aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist
"$PY" -c "import sglang as sgl; sgl.function; sgl.gen; sgl.RuntimeEndpoint; print('sglang client OK', sgl.__version__)"
