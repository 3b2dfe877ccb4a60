"""The physical limits written beside the bench's figures, measured on the same machine and run.

A decode step must read every weight once (shared by all sessions of the step) and each
session's K/V; it cannot run faster than those bytes at the memory's bandwidth, nor faster than
its FLOPs at the matmul peak. A prefill token costs ~2 FLOPs per weight plus its attention; it
cannot run faster than the peak. Both the bandwidth and the peak are measured here (a streaming
sum over 512 MiB; MKL's float32 sgemm at 1024^3) with the quantized matmul kernel's own rate at a
prefill chunk's shape: the FLOP limits use the faster of the two (the int4 kernel's bf16 pair dot
products outrun float32 FMAs, so sgemm alone is not this CPU's peak for it). The concurrent
sessions' limits are taken at their own context, not the long document's.
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


def _decode_limit(engine: Any, n: int, context: int, bw: float, peak: float) -> float:
    """tok/s of `n` sessions decoding at `context` tokens each: a step reads every weight once and
    each session's K/V, and computes n tokens' FLOPs; it takes the longer of the two."""
    model, cfg = engine.model, engine.model.cfg
    layers, head = weights_per_token(cfg)
    attention = 4 * cfg.layers * cfg.heads * cfg.head_dim * context  # scores + values, one query
    seconds = max(
        (model.weight_bytes + n * engine.kv_bytes_per_token * context) / (bw * 1e9),
        n * (2 * (layers + head) + attention) / (peak * 1e9),
    )
    return n / seconds


def limits(engine: Any, context: int, sessions: list[int], session_context: int) -> dict[str, Any]:
    """Measured bandwidth and peaks, and the limits they put on this engine's decode at `context`
    tokens (1 session), on `sessions` concurrent sessions at `session_context` tokens each (1
    included: their ratios' bound), and on its prefill at `context`."""
    model, cfg = engine.model, engine.model.cfg
    bw, sgemm, kernel = bandwidth_gb_s(), sgemm_gflops(), layer_gflops(model)
    peak = max(sgemm, kernel)
    layers, _ = weights_per_token(cfg)
    attention = 4 * cfg.layers * cfg.heads * cfg.head_dim * context
    prefill_flops = 2 * layers + attention / 2  # a prompt token sees half the context on average
    return {
        "bandwidth_gb_s": bw,
        "sgemm_gflops": sgemm,
        "kernel_gflops": kernel,
        "peak_gflops": peak,
        "weight_bytes": model.weight_bytes,
        "kv_bytes_at_context": engine.kv_bytes_per_token * context,
        "context": context,
        "session_context": session_context,
        "decode_limit_tok_s": _decode_limit(engine, 1, context, bw, peak),
        "aggregate_limit_tok_s": {
            str(n): _decode_limit(engine, n, session_context, bw, peak) for n in [1, *sessions]
        },
        "prefill_limit_tok_s": sgemm * 1e9 / prefill_flops,
        "prefill_limit_kernel_tok_s": kernel * 1e9 / prefill_flops,
    }


def limits_markdown(lim: dict[str, Any], label: str, one_session_tok_s: float | None = None) -> list[str]:
    """The limits' table; `one_session_tok_s` (the measured 1-session aggregate) puts each session
    count's limit beside it as the largest n/1 ratio the hardware allows this engine, and each
    limit is also given over the 1-session limit: the n/1 ratio of an engine that ran every step
    at its limit (a fast single session raises the bar the ratio is measured against)."""
    agg = lim["aggregate_limit_tok_s"]

    def bound(n: str) -> str:
        at_limits = f"{agg[n] / agg['1']:.1f}x the 1-session limit" if agg.get("1") else ""
        measured = f"{agg[n] / one_session_tok_s:.1f}x the measured 1 session" if one_session_tok_s else ""
        said = "; ".join(s for s in (measured, at_limits) if s)
        return f" ({said})" if said else ""

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
        f"{(lim['weight_bytes'] + lim['kv_bytes_at_context']) / 2**20:.0f} MiB | "
        f"{lim['decode_limit_tok_s']:.0f} tok/s |",
        *(
            f"| aggregate decode, {n} session{'s' * (n != '1')} at {lim['session_context']} tokens: "
            f"weights once + {n} K/V ÷ bandwidth, or FLOPs ÷ {lim['peak_gflops']:.0f} GFLOP/s | - | "
            f"{v:.0f} tok/s{bound(n) if n != '1' else ''} |"
            for n, v in agg.items()
        ),
        f"| prefill at {lim['context']} tokens: FLOPs per token ÷ sgemm peak | - | "
        f"{lim['prefill_limit_tok_s']:.0f} tok/s |",
        f"| prefill: FLOPs per token ÷ the engine's matmul kernel | - | "
        f"{lim['prefill_limit_kernel_tok_s']:.0f} tok/s |",
        "",
    ]
