"""Peer engines for `make bench`, on the same model file and token ids as ours: HF transformers
`generate` (the naive baseline, in-process, hf.py) and llama.cpp (llama-cpp-python in its own venv
`.bench-env/`, driven over JSON lines: llamacpp.py + llamacpp_worker.py). report.py renders the
whole benchmark (ours and the peers) as docs/benchmarks.md."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

from evals.benchmarks.bench_measure import BenchConfig, QAPrompts, multi_session_hits, prefix_reuse
from runtime.engine.threads import in_fresh_thread


def run_peers(
    model_path: str,
    qa: QAPrompts,
    hit_sessions: Sequence[QAPrompts],
    cfg: BenchConfig,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """{"hf_transformers": {...}, "llama_cpp": {...}, "hits": {name: multi-session result}}; a peer
    that cannot run here is reported as {"skipped": why}."""
    return {
        # HF generates on a thread of its own: its OpenMP pool must not outlive it (runtime/engine/threads.py)
        "hf_transformers": in_fresh_thread(lambda: _hf(model_path, qa, cfg, say), "bench-hf"),
        **_llama_cpp(model_path, qa, hit_sessions, cfg, say),
    }


def _hf(model_path: str, qa: QAPrompts, cfg: BenchConfig, say: Callable[[str], None]) -> dict[str, Any]:
    from evals.benchmarks.peers.hf import HFGenerateRunner

    say("peer: HF transformers generate (loading the GGUF)")
    try:
        runner = HFGenerateRunner(model_path)
    except Exception as exc:  # a broken transformers install is reported, not fatal
        return {"skipped": f"HF transformers could not load the model: {type(exc).__name__}: {exc}"}
    runner.generate(qa.questions[0], 2)  # warm-up
    result = {"prefix_reuse": prefix_reuse(runner, qa, cfg.repeats, cfg.out_tokens, cfg.decode_tokens)}
    del runner
    gc.collect()
    return result


def _llama_cpp(
    model_path: str,
    qa: QAPrompts,
    hit_sessions: Sequence[QAPrompts],
    cfg: BenchConfig,
    say: Callable[[str], None],
) -> dict[str, Any]:
    from evals.benchmarks.peers.llamacpp import LlamaCppRunner, PeerUnavailable

    say("peer: llama.cpp (llama-cpp-python in .bench-env)")
    try:
        import torch

        threads = cfg.peer_threads or cfg.threads or torch.get_num_threads()
        runner = LlamaCppRunner(model_path, ram_cache=True, threads=threads)
    except PeerUnavailable as exc:
        say(str(exc))
        return {"llama_cpp": {"skipped": str(exc)}}
    try:
        runner.reset()
        runner.generate(qa.questions[0], 2)  # warm-up
        reuse = prefix_reuse(runner, qa, cfg.repeats, cfg.out_tokens, cfg.decode_tokens)
        say("peer: llama.cpp multi-session hit rate (live context only, then with its RAM cache)")
        live = multi_session_hits(
            runner.with_ram_cache(False), hit_sessions, out_tokens=min(8, cfg.out_tokens)
        )
        ram = multi_session_hits(runner.with_ram_cache(True), hit_sessions, out_tokens=min(8, cfg.out_tokens))
    finally:
        runner.close()
    return {
        "llama_cpp": {"version": runner.version, "threads": threads, "prefix_reuse": reuse},
        "hits": {"llama_cpp": live, "llama_cpp_ram_cache": ram},
    }
