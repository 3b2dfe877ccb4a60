"""The physical limits written beside the bench's figures, measured on the same machine and run.

A decode step must read every weight once (shared by all sessions of the step) and each
session's K/V; it cannot run faster than those bytes at the memory's bandwidth, nor faster than
its FLOPs at the matmul peak. A prefill token costs ~2 FLOPs per weight plus its attention; it
cannot run faster than the peak. Both the bandwidth and the peak are measured here (a streaming
sum over 512 MiB; MKL's float32 sgemm at 1024^3, the best case of this CPU's FMA units), and the
quantized matmul kernel's own rate at a prefill chunk's shape is written beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

#: bytes streamed by the bandwidth probe: far past every cache level
PROBE_BYTES = 512 * 2**20


def _best(fn: Callable[[], object], repeats: int = 5) -> float:
    """Seconds of the fastest of `repeats` calls (after one warm-up)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bandwidth_gb_s() -> float:
    """Read bandwidth: a sum over a buffer far larger than the caches."""
    x = torch.ones(PROBE_BYTES // 4)
    return PROBE_BYTES / _best(x.sum) / 1e9


def sgemm_gflops(n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best(lambda: a @ b) / 1e9


def layer_gflops(model: Any, rows: int = 512) -> float:
    """The model's own first MLP matmul (its quantized or dense kernel) on a prefill chunk's rows."""
    layer = model.layers[0].gate_up
    x = torch.randn(rows, model.cfg.hidden).to(model.dtype)
    out_features = 2 * model.cfg.intermediate
    return 2 * rows * model.cfg.hidden * out_features / _best(lambda: layer(x)) / 1e9


def weights_per_token(cfg: Any) -> tuple[int, int]:
    """(multiply-adds of the decoder layers per token, of the lm_head)."""
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    per_layer = cfg.hidden * (q + 2 * kv) + q * cfg.hidden + 3 * cfg.hidden * cfg.intermediate
    return cfg.layers * per_layer, cfg.vocab_size * cfg.hidden


def limits(engine: Any, context: int, sessions: list[int]) -> dict[str, Any]:
    """Measured bandwidth and peaks, and the limits they put on this engine's decode at `context`
    tokens (1 and `sessions` sessions) and on its prefill at that length."""
    model, cfg = engine.model, engine.model.cfg
    bw, peak, kernel = bandwidth_gb_s(), sgemm_gflops(), layer_gflops(model)
    layers, head = weights_per_token(cfg)
    kv_bytes = engine.kv_bytes_per_token * context
    attention = 4 * cfg.layers * cfg.heads * cfg.head_dim * context  # scores + values, one query
    decode: dict[str, float] = {}
    for n in [1, *sessions]:
        seconds = max(
            (model.weight_bytes + n * kv_bytes) / (bw * 1e9),
            n * (2 * (layers + head) + attention) / (peak * 1e9),
        )
        decode[str(n)] = n / seconds
    prefill_flops = 2 * layers + attention / 2  # a prompt token sees half the context on average
    return {
        "bandwidth_gb_s": bw,
        "sgemm_gflops": peak,
        "kernel_gflops": kernel,
        "weight_bytes": model.weight_bytes,
        "kv_bytes_at_context": kv_bytes,
        "context": context,
        "decode_limit_tok_s": decode,
        "prefill_limit_tok_s": peak * 1e9 / prefill_flops,
        "prefill_limit_kernel_tok_s": kernel * 1e9 / prefill_flops,
    }


def limits_markdown(lim: dict[str, Any], label: str) -> list[str]:
    d = lim["decode_limit_tok_s"]
    return [
        f"## Physical limits ({label}, measured in the same run)",
        "",
        f"Memory read bandwidth {lim['bandwidth_gb_s']:.1f} GB/s (a sum over 512 MiB); float32 sgemm peak "
        f"{lim['sgemm_gflops']:.0f} GFLOP/s (1024^3); the engine's own matmul kernel "
        f"{lim['kernel_gflops']:.0f} GFLOP/s (first MLP layer, 512 rows).",
        "",
        "| what | bytes or FLOPs | limit |",
        "|---|---|---|",
        f"| decode at {lim['context']} tokens, 1 session: weights + its K/V per step ÷ bandwidth | "
        f"{(lim['weight_bytes'] + lim['kv_bytes_at_context']) / 2**20:.0f} MiB | {d['1']:.0f} tok/s |",
        *(
            f"| aggregate decode, {n} sessions: weights once + {n} K/V, or FLOPs ÷ peak | - | {v:.0f} tok/s |"
            for n, v in d.items()
            if n != "1"
        ),
        f"| prefill at {lim['context']} tokens: FLOPs per token ÷ sgemm peak | - | "
        f"{lim['prefill_limit_tok_s']:.0f} tok/s |",
        f"| prefill: FLOPs per token ÷ the engine's matmul kernel | - | "
        f"{lim['prefill_limit_kernel_tok_s']:.0f} tok/s |",
        "",
    ]
