"""Compact forward vs the HF transformers fallback per model family, same weights, same run.

    python -m evals.benchmarks.families_bench [--prompt 512] [--decode 64] [--repeats 3] [--threads 2]
                                   [--out docs/results/bench-families.md]

For each family (Qwen3, Llama 3.x) a small random-weight model is built by transformers from the
family's real config class (Qwen3: q/k norms, head_dim apart from hidden/heads; Llama 3: the
`llama3` rope scaling), then served twice through the same engine code: once on the compact
forward (`LlamaModel`), once on the HF fallback (`HFModel`, what a family without a compact
forward gets). Prefill tok/s: a cold prompt of `--prompt` tokens (time to first token); decode
tok/s: `--decode` greedy tokens after it. Best of `--repeats`, after one warm-up call. Prints a markdown table and JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from evals.benchmarks.bench_gpu import IdTokenizer

SHAPE = dict(
    vocab_size=32000,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    intermediate_size=768,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def _config(family: str) -> Any:
    from transformers import LlamaConfig, Qwen3Config

    if family == "qwen3":
        return Qwen3Config(**SHAPE, head_dim=64, rope_theta=1e6)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    return LlamaConfig(**SHAPE, rope_parameters=rope)


def _engines(family: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from runtime import Engine
    from runtime.model.hf_model import HFModel
    from runtime.model.model import LlamaModel, ModelConfig

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(family)).eval()
    state = {k: v.detach() for k, v in hf.state_dict().items()}
    compact = LlamaModel(ModelConfig.from_hf(hf.config), state, torch.float32, "cpu")
    fallback = HFModel(hf, torch.float32, "cpu")
    return {
        "compact": Engine.from_model(compact, IdTokenizer(), f"{family}-compact", max_total_tokens=8192),
        "hf_fallback": Engine.from_model(fallback, IdTokenizer(), f"{family}-hf", max_total_tokens=8192),
    }


def _measure(engine: Any, prompt: list[int], decode: int, repeats: int) -> dict[str, float]:
    sp = {"temperature": 0, "max_new_tokens": decode, "ignore_eos": True}
    engine.generate(
        input_ids=prompt[:64], sampling_params=sp, prefix_cache=False
    )  # warm-up (kernels, threads)
    best_prefill = best_decode = 0.0
    outputs = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(input_ids=prompt, sampling_params=sp, prefix_cache=False)
        total = time.perf_counter() - t0
        ttft = float(out["meta_info"]["ttft"])
        best_prefill = max(best_prefill, len(prompt) / ttft)
        best_decode = max(best_decode, (decode - 1) / max(total - ttft, 1e-9))
        outputs = out["output_ids"]
    return {"prefill_tok_s": best_prefill, "decode_tok_s": best_decode, "output_ids": outputs}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(args.threads)
    prompt = torch.randint(0, SHAPE["vocab_size"], (args.prompt,), generator=torch.Generator().manual_seed(1))
    rows = []
    for family in ("qwen3", "llama3"):
        engines = _engines(family)
        try:
            results = {
                name: _measure(eng, prompt.tolist(), args.decode, args.repeats)
                for name, eng in engines.items()
            }
        finally:
            for eng in engines.values():
                eng.shutdown()
        same = results["compact"].pop("output_ids") == results["hf_fallback"].pop("output_ids")
        rows.append({"family": family, **results, "greedy_outputs_identical": same})
    return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        "| family | prefill tok/s compact | prefill tok/s HF fallback | decode tok/s compact | "
        "decode tok/s HF fallback | decode speedup | greedy identical |\n|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        c, h = r["compact"], r["hf_fallback"]
        lines.append(
            f"| {r['family']} | {c['prefill_tok_s']:.0f} | {h['prefill_tok_s']:.0f} | {c['decode_tok_s']:.0f} | "
            f"{h['decode_tok_s']:.0f} | {c['decode_tok_s'] / h['decode_tok_s']:.1f}x | {r['greedy_outputs_identical']} |"
        )
    lines.append(
        f"\n{args.prompt}-token prompt, {args.decode} decoded tokens, float32, {args.threads} threads, "
        f"best of {args.repeats}; shape: {json.dumps(SHAPE)}"
    )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """One sentence per family: the report's `Summary:` paragraph (evals/benchmarks/bench.py lists it in
    docs/benchmarks.md under "Measured by other commands")."""
    parts = []
    for r in rows:
        c, h = r["compact"], r["hf_fallback"]
        parts.append(
            f"{r['family']} compact forward prefill {c['prefill_tok_s']:.0f} tok/s, decode "
            f"{c['decode_tok_s']:.0f} tok/s vs the HF fallback's {h['prefill_tok_s']:.0f} / "
            f"{h['decode_tok_s']:.0f} tok/s ({c['decode_tok_s'] / h['decode_tok_s']:.1f}x decode)"
        )
    return "; ".join(parts) + " (same weights, same run, tiny random models)."


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    import os
    import platform

    load = os.getloadavg()[0]
    return (
        "# Model families: compact forward vs HF fallback (`python -m evals.benchmarks.families_bench`)\n\n"
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}; 1-minute load average {load:.1f} at the end (other work shared the "
        "machine: compare the columns of one row, not rows of different runs).\n\n"
        f"{table(rows, args)}\n\nSummary: {summary(rows)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.families_bench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = p.parse_args(argv)
    rows = run(args)
    print(table(rows, args))
    print(json.dumps(rows, indent=1))
    if args.out is not None:
        args.out.write_text(report(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
