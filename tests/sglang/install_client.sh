#!/usr/bin/env bash
# Installs SGLang's *frontend client* (test-only) so that tests/server/test_sglang_client.py can run
# an @sgl.function program through sgl.RuntimeEndpoint against `radixagent serve`.
# Per shared/notes/sglang.md: sglang itself and a few pure-Python packages, each with --no-deps,
# on top of torch, transformers, requests and numpy from the product venv. Never the CUDA stack.
# Usage: bash tests/sglang/install_client.sh [DIR]   (default: .sgl-client in the repository)
# The packages go to DIR (pip --target), never into the product venv; the test appends DIR to
# sys.path, so the venv's own packages keep precedence.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET="${1:-$ROOT/.sgl-client}"
PY="$ROOT/.venv/bin/python"
test -x "$PY" || { echo "no python at $PY (run 'make setup' first)" >&2; exit 2; }
check() { PYTHONPATH="$TARGET" "$PY" -c "import sglang as sgl; sgl.function; sgl.gen; sgl.RuntimeEndpoint; print('sglang client OK', sgl.__version__)"; }

if check 2>/dev/null; then exit 0; fi
"$PY" -m pip install -q --no-deps --target "$TARGET" sglang==0.5.23 orjson pybase64 triton msgspec pyzmq \
    ipython traitlets multidict yarl propcache aiohappyeyeballs aiosignal frozenlist
check
