"""llama.cpp as a benchmark peer: `llamacpp_worker.py` runs in the benchmark's own venv
(`.bench-env/`, never a project dependency) and is driven over JSON lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from evals.benchmarks.bench_measure import Sample

BENCH_ENV = Path(__file__).resolve().parents[3] / ".bench-env"  # the repository root's
WORKER = Path(__file__).with_name("llamacpp_worker.py")
SETUP = "make bench-peers-setup   # a source build of llama-cpp-python 0.3.36 (AMX off), ~7 min on 2 cores"


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (missing venv, failed start); the message says how to set it up."""


class LlamaCppRunner:
    """Runner protocol over the worker process. `ram_cache` adds llama-cpp-python's LlamaRAMCache
    (several saved prompt states) to the live-context reuse that llama.cpp always does."""

    def __init__(
        self,
        model_path: str,
        ram_cache: bool = True,
        threads: int = 2,
        ctx: int = 4096,
        env: Path = BENCH_ENV,
    ) -> None:
        python = env / "bin" / "python"
        if not python.exists():
            raise PeerUnavailable(f"llama.cpp peer skipped: no {python}. Set it up with: {SETUP}")
        self.name = "llama.cpp" + (" +RAM cache" if ram_cache else "")
        self.ram_cache = ram_cache
        self.proc = subprocess.Popen(
            [str(python), str(WORKER), model_path, "--threads", str(threads), "--ctx", str(ctx)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        hello = self._read()
        self.version = hello.get("llama_cpp_python", "?")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise PeerUnavailable(
                f"llama.cpp worker exited ({code}); is llama-cpp-python installed in "
                f"{BENCH_ENV}? Set it up with: {SETUP}"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp worker: {reply['error']}")
        return reply

    def _call(self, **req) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        return self._read()

    def generate(self, ids: list[int], max_new_tokens: int) -> Sample:
        r = self._call(op="generate", ids=ids, max_new_tokens=max_new_tokens)
        return Sample(r["prompt_tokens"], r["cached_tokens"], r["ttft_s"], r["e2e_s"], r["output_ids"])

    def reset(self) -> None:
        self._call(op="reset", ram_cache=self.ram_cache)

    def with_ram_cache(self, on: bool) -> LlamaCppRunner:
        """The same process and weights with the RAM cache switched (takes effect at reset)."""
        self.ram_cache = on
        self.name = "llama.cpp" + (" +RAM cache" if on else "")
        return self

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
