"""HF transformers `generate` as the naive peer: the same GGUF loaded with AutoModelForCausalLM
(dequantized, the engine's dtype), each request computed from scratch (no reuse across calls)."""

from __future__ import annotations

import time
from pathlib import Path

from evals.benchmarks.bench_measure import Sample


class _Clock:
    """A transformers streamer that stamps each `put`: the first is the prompt, then one per token."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


class HFGenerateRunner:
    name = "HF transformers generate"

    def __init__(self, model_path: str, dtype: str = "float32") -> None:
        from runtime.config import offline_hub

        offline_hub()
        import torch
        from transformers import AutoModelForCausalLM

        path = Path(model_path)
        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        folder = path.parent if path.suffix == ".gguf" else path
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), **kwargs
        ).eval()

    def generate(self, ids: list[int], max_new_tokens: int) -> Sample:
        torch = self.torch
        x = torch.tensor([ids])
        clock = _Clock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=0,
                streamer=clock,
            )
        e2e = time.perf_counter() - start
        tokens = out[0, len(ids) :].tolist()
        ttft = clock.stamps[1] - start if len(clock.stamps) > 1 else e2e
        return Sample(len(ids), 0, ttft, e2e, tokens)

    def reset(self) -> None:
        """Nothing is kept between calls."""
