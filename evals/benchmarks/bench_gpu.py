"""`make bench-gpu`: the engine on a CUDA device, timed with seeded random weights.

A GPU host here has torch and transformers but can download nothing and cannot bring the model
file, so the same llama architecture as SmolLM2-135M, and a Llama-3.2-1B-shaped one, are built
from their configs with random weights (`LlamaModel.random`). Timings do not depend on the
weights' values; cached-vs-uncached greedy identity still must hold. Measures, per model: TTFT
cold vs cached on a 2k-token prompt, single-stream decode tok/s, aggregate decode at 1/4/16/64
concurrent sessions. Prints a JSON summary and writes it to $OUT/gpu.json when OUT is set.

    python -m evals.benchmarks.bench_gpu                      # on the GPU host (bf16)
    python -m evals.benchmarks.bench_gpu --device cpu --tiny  # a seconds-long check that it runs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    # ModelConfig fields: arch, vocab_size, hidden, layers, heads, kv_heads, head_dim, intermediate,
    # rope_theta, eps, max_positions, tie_embeddings
    "smollm2-135m-shape": dict(
        arch="llama",
        vocab_size=49152,
        hidden=576,
        layers=30,
        heads=9,
        kv_heads=3,
        head_dim=64,
        intermediate=1536,
        rope_theta=100000.0,
        eps=1e-5,
        max_positions=8192,
        tie_embeddings=True,
    ),
    "llama-1b-shape": dict(
        arch="llama",
        vocab_size=128256,
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        head_dim=64,
        intermediate=8192,
        rope_theta=500000.0,
        eps=1e-5,
        max_positions=8192,
        tie_embeddings=True,
    ),
    "tiny": dict(
        arch="llama",
        vocab_size=512,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        rope_theta=10000.0,
        eps=1e-5,
        max_positions=4096,
        tie_embeddings=True,
    ),
}
DTYPE_NAMES = {"bfloat16": "bfloat16", "float32": "float32", "float16": "float16"}


class IdTokenizer:
    """The scheduler only detokenizes (for stop strings and `text`): ids as space-separated text."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def _ensure_psutil() -> None:
    """runtime.config sizes pools with psutil; a bare GPU image may lack it: read /proc instead."""
    if importlib.util.find_spec("psutil") is not None:
        return
    shim = types.ModuleType("psutil")
    pages = lambda: os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # noqa: E731
    shim.virtual_memory = lambda: types.SimpleNamespace(available=pages())  # type: ignore[attr-defined]
    sys.modules["psutil"] = shim


def engine_from_model(model: Any, name: str, **config: Any) -> Any:
    """An Engine around an already-built LlamaModel, no tokenizer: requests pass input_ids."""
    from runtime.engine.engine import Engine

    return Engine.from_model(model, IdTokenizer(), name, **config)


def random_prompts(vocab: int, doc_tokens: int, n_questions: int, seed: int) -> Any:
    import torch

    from evals.benchmarks.bench_measure import QAPrompts

    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
    return QAPrompts(ids(doc_tokens), [ids(24) for _ in range(n_questions)])


def bench_model(name: str, args: argparse.Namespace, say) -> dict[str, Any]:
    import torch

    from evals.benchmarks.bench_measure import EngineRunner, prefix_reuse, throughput_sweep
    from runtime.model.model import LlamaModel, ModelConfig

    cfg = ModelConfig(**MODELS[name])
    t0 = time.perf_counter()
    model = LlamaModel.random(cfg, getattr(torch, args.dtype), args.device, seed=0)
    params = cfg.params
    say(f"{name}: {params / 1e6:.0f}M params built in {time.perf_counter() - t0:.1f} s")
    sessions = tuple(args.sessions)
    pool = max(sessions) * (args.session_tokens + 24 + args.new_tokens) + 4 * (args.doc_tokens + 256)
    engine = engine_from_model(
        model,
        name,
        max_total_tokens=pool,
        max_running_requests=max(sessions),
        max_queue=max(256, max(sessions)),
    )
    try:
        runner = EngineRunner(engine, f"radixagent {args.device} {args.dtype}")
        qa = random_prompts(cfg.vocab_size, args.doc_tokens, 6, seed=1)
        runner.generate(qa.prompt(5), 4)  # warm-up: kernels for the long-prefill shapes
        runner.generate(qa.questions[0], 8)
        say(f"{name}: prefix reuse, {args.doc_tokens}-token document")
        reuse = prefix_reuse(runner, qa, args.repeats, decode_tokens=args.new_tokens)
        docs = [
            random_prompts(cfg.vocab_size, args.session_tokens, 1, seed=100 + i).prompt(0)
            for i in range(max(sessions))
        ]
        say(f"{name}: throughput at {sessions} sessions")
        sweep = throughput_sweep(engine, docs, sessions, args.new_tokens)
    finally:
        engine.shutdown()
    result = {
        "name": name,
        "config": asdict(cfg),
        "params": params,
        "dtype": args.dtype,
        "prefix_reuse": reuse,
        "throughput": sweep,
    }
    if args.dtype != "float32":
        result["identity_float32"] = identity_fp32(cfg, args, qa)
    return result


def identity_fp32(cfg: Any, args: argparse.Namespace, qa: Any) -> float:
    """Greedy outputs cold vs cached in float32 (bf16 rounding may flip a near-tied argmax)."""
    import torch

    from evals.benchmarks.bench_measure import EngineRunner, prefix_reuse
    from runtime.model.model import LlamaModel

    model = LlamaModel.random(cfg, torch.float32, args.device, seed=0)
    engine = engine_from_model(model, "fp32-check", max_total_tokens=4 * (args.doc_tokens + 256))
    try:
        return prefix_reuse(EngineRunner(engine), qa, 2, decode_tokens=2)["outputs_identical"]
    finally:
        engine.shutdown()


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return platform.processor() or platform.machine()


def gpu_markdown(gpu: dict[str, Any]) -> list[str]:
    """The report's GPU section (evals/benchmarks/bench.py renders it when docs/results/bench-gpu.json exists)."""
    from evals.benchmarks.peers.report import throughput_rows

    out = [
        f"## GPU figures ({gpu['device_name']}, random weights, `make bench-gpu`)",
        "",
        f"torch {gpu['torch']}, measured in {gpu['duration_s']:.0f} s. Seeded random weights in the "
        "model's shape (timing does not depend on weight values).",
        "",
        "| model | params | dtype | prompt tokens | cold TTFT p50 | cached TTFT p50 | speedup | prefill tok/s "
        "| decode tok/s | greedy cold = cached | same, float32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in gpu["models"]:
        x = m["prefix_reuse"]
        fp32 = m.get("identity_float32")
        out.append(
            f"| {m['name']} | {m['params'] / 1e6:.0f}M | {m['dtype']} | {x['prompt_tokens']} "
            f"| {x['ttft_cold_p50_s'] * 1e3:.1f} ms | {x['ttft_cached_p50_s'] * 1e3:.1f} ms "
            f"| {x['speedup_ttft']:.1f}x | {x['prefill_tok_s']:.0f} | {x['decode_tok_s']:.1f} "
            f"| {x['outputs_identical']:.0%} | {'-' if fp32 is None else f'{fp32:.0%}'} |"
        )
    for m in gpu["models"]:
        out += ["", f"Throughput, {m['name']}:", "", *throughput_rows(m["throughput"]["rows"])]
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.bench_gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--dtype", default=None, choices=sorted(DTYPE_NAMES), help="default bfloat16 (cuda), float32"
    )
    p.add_argument(
        "--models", default="smollm2-135m-shape,llama-1b-shape", help=f"comma list of {list(MODELS)}"
    )
    p.add_argument(
        "--tiny", action="store_true", help="the tiny model and small sizes (a check that it runs)"
    )
    p.add_argument("--sessions", default="1,4,16,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--doc-tokens", type=int, default=2048)
    p.add_argument("--session-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.tiny:
        args.models, args.sessions, args.doc_tokens = "tiny", [1, 4], 256
        args.session_tokens, args.new_tokens, args.repeats = 32, 8, 2
    return args


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse(argv)
    _ensure_psutil()
    from runtime.config import env_str

    say = lambda msg: print(f"[bench-gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        say("no CUDA device here: use --device cpu (with --tiny for a quick check)")
        return 2
    started = time.perf_counter()
    models = [bench_model(name, args, say) for name in args.models.split(",")]
    summary = {
        "device": args.device,
        "device_name": device_name(args.device),
        "torch": torch.__version__,
        "dtype": args.dtype,
        "models": models,
        "duration_s": time.perf_counter() - started,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    out = env_str("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu.json").write_text(text + "\n")
        say(f"wrote {Path(out, 'gpu.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
