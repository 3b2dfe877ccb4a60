"""The markdown report of `make bench` (docs/benchmarks.md) from its results dict: ratios and
targets first, then prefix reuse, throughput, multi-session hit rate (evals/benchmarks/bench.py adds the other sections)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _x(v: float | None, unit: str = "x", digits: int = 2) -> str:
    return "skipped" if v is None else f"{v:.{digits}f}{unit}"


TargetRow = tuple[str, str, str, bool | None]


def _row(what: str, value: float | None, shown: str, target: str, ok: Callable[[float], bool]) -> TargetRow:
    """(what, measured, target, met); met is None without a number."""
    return what, shown, target, None if value is None else ok(value)


def _ratio_row(what: str, value: float | None) -> TargetRow:
    """A ratio shown for information: no target to meet."""
    return _row(what, value, _x(value), "(ratio)", lambda v: True)


def _speed_rows(
    mode: str, x: dict[str, Any], four_over_one: float | None, vs_lc: float | None
) -> list[TargetRow]:
    """One weight mode's targets: cached TTFT, decode, 4-session scaling, TTFT vs llama.cpp's."""
    return [
        _row(
            f"{mode}: cached TTFT, long-document prompt",
            x["ttft_cached_p50_s"],
            _x(x["ttft_cached_p50_s"], " s", 3),
            "<= 0.15 s",
            lambda v: v <= 0.15,
        ),
        _row(
            f"{mode}: single-stream decode at {x['decode_context_tokens']} tokens of context",
            x["decode_tok_s"],
            _x(x["decode_tok_s"], " tok/s", 1),
            ">= 40 tok/s",
            lambda v: v >= 40,
        ),
        _row(
            f"{mode}: aggregate decode, 4 sessions / 1 session",
            four_over_one,
            _x(four_over_one),
            ">= 2.5x",
            lambda v: v >= 2.5,
        ),
        _row(f"{mode}: our cached TTFT / llama.cpp's", vs_lc, _x(vs_lc), "<= 1.5x", lambda v: v <= 1.5),
    ]


def _quant_rows(q: dict[str, Any] | None, ra: dict[str, Any]) -> list[TargetRow]:
    """The quantized engine's speed targets, and the exact fast path's (issue 37: the default
    weights); none without a quantized run."""
    if q is None:
        return []
    mode = q["torchao_config"]
    sixteen = ra.get("quantized_decode_16_over_1_sessions")
    prefill = ra.get("quantized_prefill_vs_float32")
    identical = q["prefix_reuse"]["outputs_identical"]
    vs_lc = ra["quantized_cached_ttft_vs_llama_cpp"]
    return [
        *_speed_rows(mode, q["prefix_reuse"], ra["quantized_decode_4_over_1_sessions"], vs_lc),
        _row(
            f"{mode}: our decode / llama.cpp's",
            ra["quantized_decode_vs_llama_cpp"],
            _x(ra["quantized_decode_vs_llama_cpp"]),
            ">= 1.8x",
            lambda v: v >= 1.8,
        ),
        _row(
            f"{mode}: our cached TTFT / llama.cpp's, exact-and-fast target",
            vs_lc,
            _x(vs_lc),
            "<= 0.5x",
            lambda v: v <= 0.5,
        ),
        _row(f"{mode}: prefill tok/s / float32's", prefill, _x(prefill), ">= 1.0x", lambda v: v >= 1.0),
        _row(
            f"{mode}: greedy cold = cached",
            identical,
            _x(None if identical is None else 100 * identical, "%", 0),
            "100%",
            lambda v: v == 1.0,
        ),
        _row(
            f"{mode}: aggregate decode, 4 sessions / 1, exact-and-fast target",
            ra["quantized_decode_4_over_1_sessions"],
            _x(ra["quantized_decode_4_over_1_sessions"]),
            ">= 3x",
            lambda v: v >= 3,
        ),
        _row(f"{mode}: aggregate decode, 16 sessions / 1", sixteen, _x(sixteen), ">= 6x", lambda v: v >= 6),
    ]


def _hit_rate_row(ra: dict[str, Any]) -> TargetRow:
    """Our multi-session hit rate above llama.cpp's, in percentage points."""
    diff = ra["hit_rate_minus_llama_cpp"]
    return _row(
        "multi-session hit rate, ours - llama.cpp's",
        diff,
        _x(None if diff is None else 100 * diff, " pt", 1),
        "> 0 pt",
        lambda v: v > 0,
    )


def _target_rows(r: dict[str, Any]) -> list[TargetRow]:
    """(what, measured, target, met) for the issues' targets; met is None without a number."""
    ra = r["ratios"]
    return [
        _row(
            "cached TTFT speedup (cold / cached)",
            ra["cached_ttft_speedup"],
            _x(ra["cached_ttft_speedup"]),
            ">= 15x",
            lambda v: v >= 15,
        ),
        *_speed_rows(
            "float32", r["prefix_reuse"], ra["decode_4_over_1_sessions"], ra["cached_ttft_vs_llama_cpp"]
        ),
        *_quant_rows(r.get("quantized"), ra),
        _hit_rate_row(ra),
        _ratio_row("our decode / llama.cpp's", ra["decode_vs_llama_cpp"]),
        _ratio_row("HF generate's TTFT / our cached TTFT", ra["cached_ttft_speedup_vs_hf_generate"]),
        _ratio_row("our decode / HF generate's", ra["decode_vs_hf_generate"]),
    ]


NAMES = {
    "radixagent": "radixagent (ours)",
    "hf_transformers": "HF transformers generate (no reuse)",
    "llama_cpp": "llama.cpp, live context only",
    "llama_cpp_ram_cache": "llama.cpp + LlamaRAMCache",
}


def _name(key: str, peer: dict[str, Any]) -> str:
    if key == "llama_cpp" and "version" in peer:
        return f"llama.cpp (llama-cpp-python {peer['version']}, prompt cache on)"
    return NAMES.get(key, key)


def _reuse_rows(r: dict[str, Any]) -> list[str]:
    engines = [(f"radixagent (ours), {r['machine']['dtype']}", r["prefix_reuse"])]
    if "quantized" in r:
        engines.append(
            (f"radixagent (ours), {r['quantized']['torchao_config']}", r["quantized"]["prefix_reuse"])
        )
    engines += [(_name(k, v), v["prefix_reuse"]) for k, v in r["peers"].items() if "prefix_reuse" in v]
    out = [
        "| engine | prompt tokens | cold TTFT p50 | cached TTFT p50 | speedup | cached tokens | prefill tok/s "
        "| decode tok/s | greedy cold = cached |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, x in engines:
        out.append(
            f"| {name} | {x['prompt_tokens']} | {x['ttft_cold_p50_s']:.3f} s | {x['ttft_cached_p50_s']:.3f} s "
            f"| {x['speedup_ttft']:.1f}x | {min(x['cached_tokens'])}-{max(x['cached_tokens'])} "
            f"| {x['prefill_tok_s']:.0f} | {x['decode_tok_s']:.1f} | {x['outputs_identical']:.0%} |"
        )
    out += [f"\n{k}: skipped: {v['skipped']}" for k, v in r["peers"].items() if "skipped" in v]
    return out


def throughput_rows(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "| sessions | aggregate decode tok/s | output tok/s (wall) | TTFT p50 | TTFT p95 | prompt tokens "
        "| cached tokens | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {x['sessions']} | {x['decode_tok_s']:.1f} | {x['output_tok_s']:.1f} | {x['ttft_p50_s']:.3f} s "
        f"| {x['ttft_p95_s']:.3f} s | {x['prompt_tokens']} | {x['cached_tokens']} | {x['wall_s']:.1f} s |"
        for x in rows
    ]
    return out


def _hit_rows(r: dict[str, Any]) -> list[str]:
    out = [
        "| engine | sessions x rounds | prompt tokens | cached tokens | hit rate | TTFT p50, rounds >= 2 |",
        "|---|---|---|---|---|---|",
    ]
    out += [
        f"| {name} | {x['sessions']} x {x['rounds']} | {x['prompt_tokens']} | {x['cached_tokens']} "
        f"| {x['hit_rate']:.1%} | {x['ttft_later_rounds_p50_s']:.3f} s |"
        for name, x in ((NAMES.get(k, k), v) for k, v in r["multi_session"].items())
    ]
    return out


def _load_note(m: dict[str, Any]) -> str:
    busy = max(m["loadavg_1m_start"], m["loadavg_1m_end"]) > m["cores"]
    return (
        " (above the core count: other work shared the CPU and every time here is inflated)" if busy else ""
    )


def _intro_lines(r: dict[str, Any]) -> list[str]:
    """The title and the machine, model and run the numbers come from."""
    m = r["machine"]
    return [
        "# Benchmarks (`make bench`)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
        f"dtype {m['dtype']}, device {m['device']}, Python {m['python']}; 1-minute load average "
        f"{m['loadavg_1m_start']:.1f} at the start, {m['loadavg_1m_end']:.1f} at the end"
        f"{_load_note(m)}. Model: {r['model']}. "
        f"All sections measured in one run of {r['duration_s']:.0f} s (`python -m evals.benchmarks.bench`); "
        "raw numbers in `docs/results/bench.json`. Elsewhere: the cache-manager redesign against the "
        "previous main, side by side ([bench-core-redesign.md](results/bench-core-redesign.md)), the KV tier "
        "([bench-tier.md](results/bench-tier.md)), hardening ([bench-hardening.md](results/bench-hardening.md)), "
        "the longdoc eval with the accuracy/TTFT-vs-head-length sweep "
        "([eval-longdoc/report.md](results/eval-longdoc/report.md)).",
        "",
    ]


def _targets_section(r: dict[str, Any]) -> list[str]:
    """Ratios and targets: a row per target, met yes / NO / - (no number, or a plain ratio)."""
    lines = ["## Ratios and targets", "", "| what | measured | target | met |", "|---|---|---|---|"]
    for what, shown, target, met in _target_rows(r):
        lines.append(
            f"| {what} | {shown} | {target} | {'-' if met is None or target == '(ratio)' else 'yes' if met else 'NO'} |"
        )
    return lines


def _reuse_section(r: dict[str, Any]) -> list[str]:
    """Prefix reuse: how it was measured, then a row per engine."""
    c = r["config"]
    return [
        f"## Prefix reuse: ~{c['doc_tokens']}-token document + short question",
        "",
        f"Cold: cache emptied before each of {c['repeats'] + 1} runs; cached: {c['repeats']} other questions "
        f"on the same document (medians). Same token ids for every engine, greedy, {c['out_tokens']} new tokens; "
        "decode "
        f"tok/s from one {c['decode_tokens']}-token answer at that context. HF `generate` keeps nothing "
        "between calls (its cached column is a second question recomputed); llama.cpp runs with its "
        "prompt cache (live context + LlamaRAMCache)"
        + (
            f", {r['peers']['llama_cpp']['threads']} thread(s)."
            if "threads" in r["peers"].get("llama_cpp", {})
            else "."
        ),
        "",
        *_reuse_rows(r),
    ]


def _throughput_section(r: dict[str, Any]) -> list[str]:
    """Concurrent sessions: the float32 table, then the quantized one when measured."""
    c = r["config"]
    rounds = c.get("session_rounds", c["repeats"])  # results from before the sweep interleaved
    lines = [
        "## Throughput: concurrent sessions (threads calling the engine)",
        "",
        f"Each session asks one question about its own {c['session_prompt_tokens']}-token document and "
        f"decodes {c['session_new_tokens']} tokens; all start together. Aggregate decode tok/s counts the "
        "tokens produced while every session was decoding (last first token to first finish). The "
        f"session counts run interleaved, {rounds} rounds (every count once per round, each run from a "
        "cold cache); a count's row is its run of median aggregate decode (every run's figure, in round "
        "order, in bench.json's `decode_tok_s_runs`), and each round's own ratio over its 1-session run "
        "is listed under the table.",
        "",
        *throughput_rows(r["throughput"]["rows"]),
        *round_ratio_lines(r["throughput"]),
    ]
    if "quantized" in r:
        lines += ["", f"With `--torchao-config {r['quantized']['torchao_config']}` (same sessions):", ""]
        lines += throughput_rows(r["quantized"]["throughput"]["rows"])
        lines += round_ratio_lines(r["quantized"]["throughput"])
    return lines


def round_ratio_lines(sweep: dict[str, Any]) -> list[str]:
    """Each round's aggregate decode over that round's 1-session run, per session count."""
    per_count = [
        f"{key.removeprefix('decode_').split('_')[0]} sessions: " + ", ".join(f"{x:.2f}x" for x in ratios)
        for key, ratios in sweep.items()
        if key.endswith("_over_1_rounds")
    ]
    return (
        ["", "Aggregate decode over 1 session, round by round: " + "; ".join(per_count) + "."]
        if per_count
        else []
    )


def _hit_section(r: dict[str, Any]) -> list[str]:
    """Multi-session hit rate: the setting, then a row per engine."""
    c = r["config"]
    return [
        f"## Multi-session hit rate: {c['hit_docs']} documents of {c['hit_doc_tokens']} tokens, questions "
        "alternating between them",
        "",
        "llama.cpp reuses only its live context (one prompt per slot); with llama-cpp-python's "
        "LlamaRAMCache it restores saved states.",
        "",
        *_hit_rows(r),
    ]


def render_report(r: dict[str, Any]) -> str:
    """Our and the peers' sections; evals/benchmarks/bench.py's `write_report` appends the GPU, KV and suite ones."""
    lines = [
        *_intro_lines(r),
        *_targets_section(r),
        "",
        *_reuse_section(r),
        "",
        *_throughput_section(r),
        "",
        *_hit_section(r),
    ]
    return "\n".join(lines) + "\n"
