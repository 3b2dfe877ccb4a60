"""`make bench`'s KV-format section: each `kv_cache_dtype` against llama.cpp, in one run.

One int4wo-32 engine (the fast weights), a sibling per KV dtype over the same weights:
  - bytes per token and tokens per GiB of KV;
  - single-stream decode tok/s at 512 / 2k / 4k tokens of context (one cold prompt each, then
    the same prompt again in later rounds: rounds alternate ours and llama.cpp, best round kept);
  - cached TTFT on the ~2k-token document (questions after the first), and whether each decode
    prompt's greedy output, found cached in later rounds, equals its cold first-round output;
  - the eviction simulator's agents workload at the same pool size in BYTES: a float32 budget
    (a fraction of the peak working set) holds 2x the tokens in bf16, 3.76x in int8;
  - optionally the reduced agent-suite eval per KV dtype (accuracy, outputs identical).
`python -m evals.benchmarks.bench --only kv` runs this section alone and merges it into the report.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals.benchmarks.bench_measure import (
    QUESTIONS,
    EngineRunner,
    Runner,
    Sample,
    essay_documents,
    qa_prompts,
)

GIB = 2**30
DETERMINISTIC = "deterministic"
TORCH_NATIVE = "torch_native"


@dataclass(frozen=True, slots=True)
class KVBenchConfig:
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "int8")  # float16: the size and path of bfloat16
    #: these dtypes again with --enable-deterministic-inference (rows "<dtype> deterministic")
    deterministic: tuple[str, ...] = ("float32", "bfloat16", "int8")
    #: these dtypes again with --attention-backend torch_native (rows "<dtype> torch_native"): decode
    #: attention converting to float32 for SDPA, what the native kernel replaced
    torch_native: tuple[str, ...] = ("bfloat16", "int8")
    contexts: tuple[int, ...] = (512, 2000, 4000)  # document tokens; prompts add ~45 of chat + question
    ttft_context: int = 2000
    questions: int = 2
    out_tokens: int = 16
    decode_tokens: int = 64
    rounds: int = 3
    torchao_config: str = "int4wo-32"
    threads: int | None = None
    peers: bool = True
    eviction_sessions: int = 64
    eviction_fractions: tuple[float, ...] = (0.25, 0.5)
    eviction_policies: tuple[str, ...] = ("lru", "session")
    suites: bool = False

    def __post_init__(self) -> None:
        if self.ttft_context not in self.contexts or self.questions < 1 or self.rounds < 1:
            raise ValueError("ttft_context must be one of contexts; questions and rounds >= 1")


QUICK_KV = KVBenchConfig(
    dtypes=("float32", "int8"),
    deterministic=("int8",),
    torch_native=(),
    contexts=(64, 128),
    ttft_context=128,
    questions=1,
    out_tokens=3,
    decode_tokens=4,
    rounds=1,
    eviction_sessions=8,
    eviction_fractions=(0.5,),
)


def _measure_round(
    runner: Runner, prompts: dict[int, list[int]], cfg: KVBenchConfig, out: dict[str, Any]
) -> None:
    """Decode at each context, the TTFT context's last (so its document is the live context, as
    llama.cpp needs for reuse), then cached TTFT of the other questions on that document."""
    order = sorted(prompts, key=lambda c: c == cfg.ttft_context)
    for ctx, ids in ((c, prompts[c]) for c in order):
        s = runner.generate(ids, cfg.decode_tokens)
        out.setdefault("decode_tok_s", {}).setdefault(str(ctx), []).append(s.decode_tok_s)
        out.setdefault("decode_context_tokens", {})[str(ctx)] = s.prompt_tokens
        out.setdefault("decode_outputs", {}).setdefault(str(ctx), []).append(s.output_ids)
    qa = out["qa"]
    warm: list[Sample] = [runner.generate(qa.prompt(i), cfg.out_tokens) for i in range(1, cfg.questions + 1)]
    out.setdefault("ttft_cached_s", []).extend(s.ttft_s for s in warm)
    out.setdefault("cached_tokens", []).extend(s.cached_tokens for s in warm)


def _summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Round 1 computes each decode prompt from scratch, later rounds find it cached (all but its
    last token): `outputs_identical` is the fraction of later-round answers equal to round 1's."""
    later = [(outs[0], o) for outs in raw["decode_outputs"].values() for o in outs[1:]]
    return {
        "outputs_identical": sum(a == b for a, b in later) / len(later) if later else None,
        "decode_tok_s": {c: max(v) for c, v in raw["decode_tok_s"].items()},
        "decode_tok_s_rounds": raw["decode_tok_s"],
        "decode_context_tokens": raw["decode_context_tokens"],
        "ttft_cached_p50_s": statistics.median(raw["ttft_cached_s"]),
        "ttft_cached_s": raw["ttft_cached_s"],
        "cached_tokens": raw["cached_tokens"],
    }


def eviction_same_bytes(cfg: KVBenchConfig, per_token: dict[str, int]) -> list[dict[str, Any]]:
    """The agents workload with each KV dtype's token capacity for one byte budget (float32's)."""
    from evals.eviction import workloads
    from evals.eviction.simulator import Replay, budget_for
    from evals.eviction.workloads import BLOCK

    w = workloads.make("agents", cfg.eviction_sessions, 0)
    peak = Replay(w, "lru", None).run().peak_working_set
    rows = []
    for frac in cfg.eviction_fractions:
        base = budget_for(w, frac, peak)  # blocks of BLOCK tokens, sized for float32
        budget_bytes = base * BLOCK * per_token["float32"]
        for dtype, bpt in per_token.items():
            blocks = budget_bytes // (bpt * BLOCK)
            for policy in cfg.eviction_policies:
                st = Replay(w, policy, blocks).run()
                rows.append(
                    {
                        "kv_cache_dtype": dtype,
                        "budget_fraction_float32": frac,
                        "policy": policy,
                        "budget_bytes": budget_bytes,
                        "budget_tokens": blocks * BLOCK,
                        "prompt_tokens": st.prompt_tokens * BLOCK,
                        "cached_tokens": st.cached_tokens * BLOCK,
                        "recomputed_tokens": st.recomputed_tokens * BLOCK,
                        "hit_rate": st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
                    }
                )
    for row in rows:
        ref = next(
            r
            for r in rows
            if r["kv_cache_dtype"] == "float32"
            and r["policy"] == row["policy"]
            and r["budget_fraction_float32"] == row["budget_fraction_float32"]
        )
        row["recomputed_vs_float32"] = (
            row["recomputed_tokens"] / ref["recomputed_tokens"] if ref["recomputed_tokens"] else None
        )
    return rows


def run_kv(
    model_path: str | None, cfg: KVBenchConfig, say: Callable[[str], None], suites_dir: Path | None = None
) -> dict[str, Any]:
    from runtime import Engine

    say(f"kv: loading the {cfg.torchao_config} engine")
    base = Engine(
        model_path, torchao_config=cfg.torchao_config, max_total_tokens=16384, num_threads=cfg.threads
    )
    engines = {d: base.sibling(kv_cache_dtype=d) for d in cfg.dtypes}
    engines |= {
        f"{d} {DETERMINISTIC}": base.sibling(kv_cache_dtype=d, enable_deterministic_inference=True)
        for d in cfg.deterministic
    }
    engines |= {
        f"{d} {TORCH_NATIVE}": base.sibling(kv_cache_dtype=d, attention_backend=TORCH_NATIVE)
        for d in cfg.torch_native
    }
    base.shutdown()  # the siblings keep the weights
    del base  # and its pool goes
    try:
        return _run(engines, cfg, say, suites_dir)
    finally:
        for e in engines.values():
            e.shutdown()


def _run(
    engines: dict[str, Any], cfg: KVBenchConfig, say: Callable[[str], None], suites_dir: Path | None
) -> dict[str, Any]:
    any_engine = next(iter(engines.values()))
    tok = any_engine.tokenize
    docs = {c: essay_documents(tok, 1, c)[0] for c in cfg.contexts}
    qa = qa_prompts(tok, docs[cfg.ttft_context], QUESTIONS)
    prompts = {c: qa_prompts(tok, d, QUESTIONS).prompt(0) for c, d in docs.items()}
    runners: dict[str, Runner] = {d: EngineRunner(e, f"radixagent kv {d}") for d, e in engines.items()}
    peer = (
        _llama_cpp(any_engine.model_path, cfg, max(len(p) for p in prompts.values()), say)
        if cfg.peers
        else None
    )
    if peer is not None and not isinstance(peer, str):
        runners["llama.cpp"] = peer
    raw: dict[str, dict[str, Any]] = {name: {"qa": qa} for name in runners}
    try:
        for runner in runners.values():
            runner.reset()
            runner.generate(tok("Hello there, how are you?"), 4)  # warm-up
        for r in range(cfg.rounds):
            for name, runner in runners.items():
                say(f"kv: round {r + 1}/{cfg.rounds}: {name}")
                _measure_round(runner, prompts, cfg, raw[name])
    finally:
        if peer is not None and not isinstance(peer, str):
            peer.close()
    rows = {}
    for name, e in engines.items():
        rows[name] = {
            **_summarize(raw[name]),
            "bytes_per_token": e.kv_bytes_per_token,
            "tokens_per_gib": GIB / e.kv_bytes_per_token,
        }
        if cfg.suites and suites_dir is not None and not name.endswith((DETERMINISTIC, TORCH_NATIVE)):
            from evals.suites.run import reduced_eval

            say(f"kv: {name}: agent suites (reduced eval)")
            rows[name]["agent_suites"] = _suite_summary(reduced_eval(e, suites_dir / f"kv-{name}"))
    say("kv: eviction simulator, agents workload, same bytes per dtype")
    out: dict[str, Any] = {
        "config": {f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
        "engines": rows,
        "eviction": eviction_same_bytes(cfg, {d: rows[d]["bytes_per_token"] for d in cfg.dtypes}),
    }
    if "llama.cpp" in raw:
        out["llama_cpp"] = {
            **_summarize(raw["llama.cpp"]),
            "version": peer.version,  # type: ignore[union-attr]
            "bytes_per_token": 2 * 30 * 3 * 64 * 2,
        }  # its default f16 K and V
    elif peer is not None:
        out["llama_cpp"] = {"skipped": peer}
    out["ratios"] = kv_ratios(out, cfg)
    return out


def _llama_cpp(model_path: str, cfg: KVBenchConfig, longest: int, say: Callable[[str], None]) -> Any:
    """The llama.cpp runner, or why it cannot run here (a string)."""
    import torch

    from evals.benchmarks.peers.llamacpp import LlamaCppRunner, PeerUnavailable

    try:
        return LlamaCppRunner(
            model_path,
            ram_cache=True,
            threads=cfg.threads or torch.get_num_threads(),
            ctx=longest + cfg.decode_tokens + 64,
        )
    except PeerUnavailable as exc:
        say(str(exc))
        return str(exc)


def _suite_summary(results: dict[str, Any]) -> dict[str, Any]:
    suites = results.get("suites", {})
    return {
        name: {
            "accuracy_cached": s["cached"].get("accuracy"),
            "accuracy_uncached": s["uncached"].get("accuracy"),
            "outputs_identical": s["cached"].get("outputs_identical"),
        }
        for name, s in suites.items()
    }


def kv_ratios(out: dict[str, Any], cfg: KVBenchConfig) -> dict[str, float | None]:
    lc = out.get("llama_cpp", {})
    ctx = str(cfg.ttft_context)
    ratios: dict[str, float | None] = {}
    for name, row in out["engines"].items():
        lc_decode = lc.get("decode_tok_s", {}).get(ctx)
        ratios[f"{name}_decode_2k_vs_llama_cpp"] = row["decode_tok_s"][ctx] / lc_decode if lc_decode else None
        lc_ttft = lc.get("ttft_cached_p50_s")
        ratios[f"{name}_cached_ttft_vs_llama_cpp"] = row["ttft_cached_p50_s"] / lc_ttft if lc_ttft else None
    return ratios


def kv_section(
    args: argparse.Namespace, model_path: str | None, say: Callable[[str], None]
) -> dict[str, Any]:
    """The section as `make bench` runs it (bench.py's flags: --quick, --threads, --no-peers, --no-suites)."""
    cfg = replace(
        QUICK_KV if args.quick else KVBenchConfig(),
        threads=args.threads,
        peers=not args.no_peers,
        suites=not args.no_suites and not args.quick,
    )
    return run_kv(model_path, cfg, say, args.out.parent / "results" / "eval")


# ---- report --------------------------------------------------------------------------------------

TARGETS = {"bfloat16": 1.3, "int8": 1.6}  # decode at 2k vs llama.cpp's, issue 23


def _f(v: float | None, fmt: str = "{:.2f}x") -> str:
    return "skipped" if v is None else fmt.format(v)


def _evict_cell(rows: list[dict[str, Any]], dtype: str, frac: float) -> str:
    cells = [
        f"{r['policy']} {r['hit_rate']:.1%}"
        for r in rows
        if r["kv_cache_dtype"] == dtype and r["budget_fraction_float32"] == frac
    ]
    return ", ".join(cells) or "-"


def _kv_intro(cfg: dict[str, Any], ctxs: list[str], tc: str) -> list[str]:
    """The section's heading and how it was measured."""
    return [
        "## KV cache dtype (`--kv-cache-dtype`)",
        "",
        f"Weights `{cfg['torchao_config']}`; one engine per KV dtype over the same weights (siblings), "
        f"llama.cpp in the same run ({cfg['rounds']} rounds alternating engines, best decode round kept). "
        f"Decode: {cfg['decode_tokens']} greedy tokens after a document of {', '.join(ctxs)} tokens (+ ~45 of "
        f"chat and question). Cached TTFT: median of {cfg['questions']} other questions per round on the "
        f"{tc}-token document. Outputs identical: each decode prompt cached in later rounds vs its cold first round. "
        "Unmarked rows are the default (the exact fast path: docs/deterministic-inference.md); rows marked "
        "deterministic add `--enable-deterministic-inference` (with quantized weights the same path, so the "
        "two measure the same code: their difference is the run's noise); rows marked torch_native run "
        "`--attention-backend torch_native` (PyTorch's attention, not exact).",
        "",
    ]


def _kv_target_table(out: dict[str, Any], tc: str) -> list[str]:
    """Decode at the TTFT context and cached TTFT, each KV dtype against llama.cpp's."""
    ra = out["ratios"]
    lines = ["| what | measured | target | met |", "|---|---|---|---|"]
    for name, row in out["engines"].items():
        v = ra.get(f"{name}_decode_2k_vs_llama_cpp")
        target = TARGETS.get(name)
        met = "-" if v is None or target is None else "yes" if v >= target else "NO"
        lines.append(
            f"| {name} KV: decode at {row['decode_context_tokens'][tc]} tokens / llama.cpp's | {_f(v)} "
            f"| {'>= ' + str(target) + 'x' if target else '(ratio)'} | {met} |"
        )
    for name in out["engines"]:
        v = ra.get(f"{name}_cached_ttft_vs_llama_cpp")
        lines.append(
            f"| {name} KV: cached TTFT / llama.cpp's | {_f(v)} | <= 0.5x "
            f"| {'-' if v is None else 'yes' if v <= 0.5 else 'NO'} |"
        )
    return lines


def _suite_cell(row: dict[str, Any]) -> str:
    """A dtype's agent-suite accuracy, cached / uncached, per suite that has one."""
    suites = row.get("agent_suites", {})
    return (
        ", ".join(
            f"{k} {_f(s['accuracy_cached'], '{:.0%}')} / {_f(s['accuracy_uncached'], '{:.0%}')}"
            for k, s in suites.items()
            if s["accuracy_cached"] is not None
        )
        or "-"
    )


def _dtype_row(out: dict[str, Any], name: str, row: dict[str, Any], ctxs: list[str]) -> str:
    """One KV dtype's row of the measures table."""
    cfg = out["config"]
    cells = [
        name,
        str(row["bytes_per_token"]),
        f"{row['tokens_per_gib']:,.0f}",
        *(f"{row['decode_tok_s'][c]:.1f}" for c in ctxs),
        f"{row['ttft_cached_p50_s']:.3f} s",
        *(_evict_cell(out["eviction"], name, f) for f in cfg["eviction_fractions"]),
        _f(row["outputs_identical"], "{:.0%}"),
    ]
    if cfg.get("suites"):
        cells.append(_suite_cell(row))
    return "| " + " | ".join(cells) + " |"


def _llama_cpp_row(lc: dict[str, Any], cfg: dict[str, Any], ctxs: list[str]) -> str:
    """llama.cpp's row of the measures table (its default f16 KV; no eviction or suite cells)."""
    cells = [
        f"llama.cpp {lc['version']} (f16 KV)",
        str(lc["bytes_per_token"]),
        f"{GIB / lc['bytes_per_token']:,.0f}",
        *(f"{lc['decode_tok_s'][c]:.1f}" for c in ctxs),
        f"{lc['ttft_cached_p50_s']:.3f} s",
        *("-" for _ in cfg["eviction_fractions"]),
        "-",
    ]
    return "| " + " | ".join(cells + (["-"] if cfg.get("suites") else [])) + " |"


def _kv_measures_table(out: dict[str, Any], ctxs: list[str]) -> list[str]:
    """KV dtype x measures (bytes, decode per context, cached TTFT, eviction hit rates, outputs
    identical, suites when run), then llama.cpp's row or why it was skipped."""
    cfg, lc = out["config"], out.get("llama_cpp", {})
    head = [
        "KV dtype",
        "bytes/token",
        "tokens per GiB",
        *(f"decode tok/s at {c}" for c in ctxs),
        "cached TTFT",
        *(f"agents hit rate, bytes of float32 at {f:.0%}" for f in cfg["eviction_fractions"]),
        "outputs identical",
    ]
    if cfg.get("suites"):
        head.append("suite accuracy (cached / uncached)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [_dtype_row(out, name, row, ctxs) for name, row in out["engines"].items()]
    if "decode_tok_s" in lc:
        lines.append(_llama_cpp_row(lc, cfg, ctxs))
    elif "skipped" in lc:
        lines += ["", f"llama.cpp: skipped: {lc['skipped']}"]
    return lines


_KV_NOTES = [
    "Decode tokens' attention reads the stored K/V directly in the native kernel "
    "(`--attention-backend native_cpu`, runtime/model/decode_kernel.py: each row converted in registers), "
    "with each layer's rope and K/V store in the same call; the quantized weights' int8 lm_head, "
    "RMSNorms and silu*up of a decode step run in the same library, and its attention and lm_head "
    "prefetch the rows they read next (a 2k-token step's K/V and weights do not stay in cache "
    "between steps: without prefetches both ran at the memory's latency, ~10-13 GB/s); rows marked torch_native run "
    "PyTorch's ops for all of it and convert each layer's K/V into a float32 scratch for SDPA, prompt rows "
    "included (on the exact path prompt rows run the native kernel too; SDPA on bf16/fp16 directly and fp8 conversion measured several times slower on this "
    "CPU: [bench-kv-attention.md](results/bench-kv-attention.md), `python -m evals.benchmarks.kv_attention`). "
    "llama.cpp is llama-cpp-python built by `make bench-peers-setup` for this CPU (-march=native, "
    "AMX off: ggml's AMX matmul crashes on the bundled Q4_1 model), its default f16 KV.",
    "",
    "Outputs identical below 100% (the torch_native rows) is not a cache bug: SDPA's flash kernel "
    "chooses its blocking from each call's shape, so a token computed alone (a decode step, the one "
    "token a full cache hit recomputes) gets other last bits than inside a prefill chunk, and bf16 "
    "activations turn those into different greedy tokens. The default rows compute every prompt "
    "row with a decode step's arithmetic ([deterministic-inference.md](deterministic-inference.md)).",
]


def _kv_eviction_table(out: dict[str, Any]) -> list[str]:
    """The eviction simulator at float32's pool bytes: a row per budget, policy and KV dtype."""
    lines = [
        f"Eviction simulator, `agents` workload, {out['config']['eviction_sessions']} sessions, seed 0: each KV "
        "dtype gets the pool BYTES that float32 gets at the given fraction of the peak working set.",
        "",
        "| float32 budget | policy | KV dtype | pool tokens | hit rate | recomputed prefill tokens "
        "| vs float32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in out["eviction"]:
        lines.append(
            f"| {r['budget_fraction_float32']:.0%} ({r['budget_bytes'] / 2**20:,.0f} MiB) | {r['policy']} "
            f"| {r['kv_cache_dtype']} | {r['budget_tokens']:,} | {r['hit_rate']:.1%} "
            f"| {r['recomputed_tokens']:,} | {_f(r['recomputed_vs_float32'])} |"
        )
    return lines


def kv_markdown(out: dict[str, Any]) -> list[str]:
    """The section of docs/benchmarks.md: targets, then KV dtype x measures, then eviction rows."""
    cfg = out["config"]
    ctxs = [str(c) for c in cfg["contexts"]]
    return [
        *_kv_intro(cfg, ctxs, str(cfg["ttft_context"])),
        *_kv_target_table(out, str(cfg["ttft_context"])),
        "",
        *_kv_measures_table(out, ctxs),
        "",
        *_KV_NOTES,
        "",
        *_kv_eviction_table(out),
    ]
