"""The KV bench section's pure parts: eviction at the same bytes, ratios and the report table."""

from __future__ import annotations

from dataclasses import asdict

from evals.benchmarks.bench_kv import QUICK_KV, eviction_same_bytes, kv_markdown, kv_ratios

PER_TOKEN = {"float32": 46080, "bfloat16": 23040, "int8": 12240}


def test_smaller_kv_gets_more_tokens_and_recomputes_less_in_the_same_bytes():
    rows = eviction_same_bytes(QUICK_KV, PER_TOKEN)
    for policy in QUICK_KV.eviction_policies:
        by = {r["kv_cache_dtype"]: r for r in rows if r["policy"] == policy}
        assert len({r["budget_bytes"] for r in by.values()}) == 1  # one byte budget for all
        assert by["float32"]["budget_tokens"] < by["bfloat16"]["budget_tokens"] < by["int8"]["budget_tokens"]
        assert by["int8"]["budget_tokens"] * PER_TOKEN["int8"] <= by["float32"]["budget_bytes"]
        assert by["float32"]["recomputed_tokens"] >= by["bfloat16"]["recomputed_tokens"]
        assert by["bfloat16"]["recomputed_tokens"] >= by["int8"]["recomputed_tokens"]
        assert by["float32"]["recomputed_vs_float32"] == 1.0


def _engine_row(decode: float, ttft: float, bpt: int) -> dict:
    ctx = {str(c): decode for c in QUICK_KV.contexts}
    return {
        "decode_tok_s": ctx,
        "decode_context_tokens": {str(c): c + 45 for c in QUICK_KV.contexts},
        "ttft_cached_p50_s": ttft,
        "bytes_per_token": bpt,
        "tokens_per_gib": 2**30 / bpt,
        "outputs_identical": 1.0,
    }


def test_ratios_and_table_name_the_targets():
    out = {
        "config": asdict(QUICK_KV),
        "engines": {"float32": _engine_row(50.0, 0.08, 46080), "int8": _engine_row(100.0, 0.04, 12240)},
        "eviction": eviction_same_bytes(QUICK_KV, {"float32": 46080, "int8": 12240}),
        "llama_cpp": {**_engine_row(60.0, 0.1, 23040), "version": "0.3.36"},
    }
    out["ratios"] = kv_ratios(out, QUICK_KV)
    assert abs(out["ratios"]["int8_decode_2k_vs_llama_cpp"] - 100 / 60) < 1e-9
    assert abs(out["ratios"]["int8_cached_ttft_vs_llama_cpp"] - 0.4) < 1e-9
    text = "\n".join(kv_markdown(out))
    assert "| int8 KV: decode at 173 tokens / llama.cpp's | 1.67x | >= 1.6x | yes |" in text
    assert "| float32 KV: cached TTFT / llama.cpp's | 0.80x | <= 0.5x | NO |" in text
    assert "| int8 | 12240 |" in text and "llama.cpp 0.3.36 (f16 KV)" in text
