"""`make bench`: the engine's measured numbers, with peers, in one run.

Sections (all measured in the same process and run, ratios first in the report; `--only kv`
measures the KV cache dtype section alone and merges it into the last run's results):
  prefix reuse   a ~2k-token document + short question: TTFT cold vs with the document cached
  throughput     1 / 4 / 16 concurrent sessions: aggregate decode tok/s, TTFT p50 / p95
  peers          HF transformers `generate` (no reuse) and llama.cpp (its prompt cache), same
                 model file and token ids; multi-session hit rate with alternating documents
  kv cache       each --kv-cache-dtype vs llama.cpp: decode at 512/2k/4k, cached TTFT, bytes per
                 token, eviction at the same bytes (evals/benchmarks/bench_kv.py)
Every runner takes token ids, decodes greedily and ignores end-of-turn, so each engine does the
same work. `python -m evals.benchmarks.bench --out docs/benchmarks.md` writes the report and its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evals.benchmarks.bench_gpu import gpu_markdown
from evals.benchmarks.bench_kv import kv_markdown, kv_section
from evals.benchmarks.bench_measure import (
    QUESTIONS,
    QUICK,
    BenchConfig,
    EngineRunner,
    cpu_name,
    essay_documents,
    multi_session_hits,
    prefix_reuse,
    qa_prompts,
    throughput_sweep,
)
from evals.benchmarks.limits import limits, limits_markdown
from evals.benchmarks.peers.report import render_report
from evals.suites.report import markdown_section
from runtime.engine.threads import in_fresh_thread


def run_ours(engine: Any, cfg: BenchConfig, say: Callable[[str], None], hits: bool = True) -> dict[str, Any]:
    """Our sections: prefix reuse, throughput, multi-session hit rate. Returns the results' parts."""
    tok = engine.tokenize
    runner = EngineRunner(engine, engine_label(engine))
    runner.generate(tok("Hello there, how are you?"), 4)  # warm-up: first-call allocations
    qa = qa_prompts(tok, essay_documents(tok, 1, cfg.doc_tokens)[0], QUESTIONS)
    say(f"prefix reuse: {len(qa.prefix)}-token document, {cfg.repeats} repeats")
    reuse = prefix_reuse(runner, qa, cfg.repeats, cfg.out_tokens, cfg.decode_tokens)
    say(f"throughput: sessions {cfg.sessions}, {cfg.session_rounds} interleaved rounds")
    runner.reset()
    chunks = essay_documents(tok, max(cfg.sessions), cfg.session_prompt_tokens)
    sweep = throughput_sweep(
        engine,
        [qa_prompts(tok, c, QUESTIONS[:1]).prompt(0) for c in chunks],
        cfg.sessions,
        cfg.session_new_tokens,
        cfg.session_rounds,
    )
    parts = {"qa": qa, "prefix_reuse": reuse, "throughput": sweep}
    if hits:
        hit_sessions = [
            qa_prompts(tok, d, QUESTIONS) for d in essay_documents(tok, cfg.hit_docs, cfg.hit_doc_tokens)
        ]
        say(f"multi-session hit rate: {cfg.hit_docs} alternating documents")
        parts |= {
            "hit_sessions": hit_sessions,
            "hits": multi_session_hits(runner, hit_sessions, out_tokens=min(8, cfg.out_tokens)),
        }
    return parts


def engine_label(engine: Any) -> str:
    quant = engine.config.torchao_config
    return f"radixagent {engine.config.dtype}" + (f" {quant}" if quant else "")


def run_quantized(engine: Any, cfg: BenchConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """Prefix reuse and throughput again with weight-only int4 (the GGUF's own 4-bit levels)."""
    from runtime import Engine

    say(f"loading the {cfg.torchao_config} engine")
    quant = Engine(
        engine.model_path,
        torchao_config=cfg.torchao_config,
        max_total_tokens=engine.pool.size,
        max_running_requests=engine.config.max_running_requests,
        num_threads=cfg.threads,
    )
    try:
        parts = run_ours(quant, cfg, lambda msg: say(f"{cfg.torchao_config}: {msg}"), hits=False)
        say(f"{cfg.torchao_config}: physical limits (bandwidth, peak FLOPs)")
        rows = parts["throughput"]["rows"]
        # the sessions' context halfway through their decode: prompt + half the new tokens
        session_context = rows[0]["prompt_tokens"] // rows[0]["sessions"] + cfg.session_new_tokens // 2
        sessions = [n for n in cfg.sessions if n != 1]
        # the probes' torch ops on a thread of their own: an OpenMP pool left on this (main) thread
        # would throttle every engine step after it (runtime/engine/threads.py)
        bounds = in_fresh_thread(
            lambda: limits(quant, cfg.doc_tokens, sessions, session_context), "bench-limits"
        )
    finally:
        quant.shutdown()
    return {
        "torchao_config": cfg.torchao_config,
        "engine": engine_label(quant),
        "prefix_reuse": parts["prefix_reuse"],
        "throughput": parts["throughput"],
        "limits": bounds,
    }


def run_bench(engine: Any, cfg: BenchConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every section against one loaded engine; peers after ours (they load their own weights)."""
    from evals.benchmarks.peers import run_peers

    started, load_start = time.perf_counter(), os.getloadavg()[0]
    ours = run_ours(engine, cfg, say)
    quantized = run_quantized(engine, cfg, say) if cfg.torchao_config else None
    peers = run_peers(engine.model_path, ours["qa"], ours["hit_sessions"], cfg, say) if cfg.peers else {}
    results = {
        "machine": {
            **machine_info(engine),
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": os.getloadavg()[0],
        },
        "model": engine.model_name,
        "config": _config_dict(cfg),
        "prefix_reuse": ours["prefix_reuse"],
        "throughput": ours["throughput"],
        "peers": {k: v for k, v in peers.items() if k != "hits"},
        "multi_session": {"radixagent": ours["hits"], **peers.get("hits", {})},
    }
    if quantized is not None:
        results["quantized"] = quantized
    results["ratios"] = ratios(results)
    results["duration_s"] = time.perf_counter() - started
    return results


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def machine_info(engine: Any) -> dict[str, Any]:
    import platform

    import torch

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "dtype": engine.config.dtype,
        "device": engine.config.device,
        "python": platform.python_version(),
    }


def ratios(r: dict[str, Any]) -> dict[str, float | None]:
    """Headline ratios (None where a peer was skipped)."""
    ours = r["prefix_reuse"]
    q = r.get("quantized")
    lc = r["peers"].get("llama_cpp", {}).get("prefix_reuse")
    hf = r["peers"].get("hf_transformers", {}).get("prefix_reuse")
    lc_hits = r["multi_session"].get("llama_cpp")

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "cached_ttft_speedup": ours["speedup_ttft"],
        "decode_4_over_1_sessions": r["throughput"].get("decode_4_over_1"),
        "cached_ttft_vs_llama_cpp": div(ours["ttft_cached_p50_s"], lc and lc["ttft_cached_p50_s"]),
        "decode_vs_llama_cpp": div(ours["decode_tok_s"], lc and lc["decode_tok_s"]),
        "cached_ttft_speedup_vs_hf_generate": div(hf and hf["ttft_cached_p50_s"], ours["ttft_cached_p50_s"]),
        "decode_vs_hf_generate": div(ours["decode_tok_s"], hf and hf["decode_tok_s"]),
        "hit_rate_minus_llama_cpp": (
            r["multi_session"]["radixagent"]["hit_rate"] - lc_hits["hit_rate"] if lc_hits else None
        ),
        "quantized_decode_4_over_1_sessions": q and q["throughput"].get("decode_4_over_1"),
        "quantized_decode_16_over_1_sessions": q and q["throughput"].get("decode_16_over_1"),
        "quantized_prefill_vs_float32": div(q and q["prefix_reuse"]["prefill_tok_s"], ours["prefill_tok_s"]),
        "quantized_cached_ttft_vs_llama_cpp": div(
            q and q["prefix_reuse"]["ttft_cached_p50_s"], lc and lc["ttft_cached_p50_s"]
        ),
        "quantized_decode_vs_llama_cpp": div(
            q and q["prefix_reuse"]["decode_tok_s"], lc and lc["decode_tok_s"]
        ),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"), help="markdown report")
    p.add_argument(
        "--json", type=Path, default=None, help="results JSON (default: results/bench.json beside --out)"
    )
    p.add_argument(
        "--gpu-json",
        type=Path,
        default=Path("docs/results/bench-gpu.json"),
        help="GPU figures from `make bench-gpu`, included when the file exists",
    )
    p.add_argument("--no-peers", action="store_true", help="skip HF transformers and llama.cpp")
    p.add_argument(
        "--no-suites", action="store_true", help="skip the reduced agent-suite eval (cached vs uncached)"
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a benchmark)")
    p.add_argument(
        "--render-only",
        action="store_true",
        help="measure nothing: rewrite --out from the results JSON (and --gpu-json)",
    )
    p.add_argument("--doc-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument(
        "--session-rounds",
        type=int,
        default=None,
        help="rounds of the session sweep (each count once per round)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--peer-threads", type=int, default=None, help="llama.cpp threads (default: as torch)")
    p.add_argument(
        "--torchao-config",
        default="int4wo-32",
        help="also measure this weight-only quantized mode ('' to skip)",
    )
    p.add_argument(
        "--only",
        choices=("kv",),
        default=None,
        help="measure one section and merge it into the existing results JSON and report "
        "(kv: the KV cache dtype section, evals/benchmarks/bench_kv.py)",
    )
    p.add_argument("--no-kv", action="store_true", help="skip the KV cache dtype section")
    return p.parse_args(argv)


def only_kv(args: argparse.Namespace, json_path: Path, gpu: dict[str, Any] | None, say) -> int:
    """`--only kv`: the KV section alone, merged into the last full run's results and report."""
    kv = kv_section(args, None, say)
    if not json_path.exists():
        json_path.with_name("bench-kv.json").write_text(json.dumps(kv, indent=2) + "\n")
        say(f"no {json_path} to merge into: wrote {json_path.with_name('bench-kv.json')} only")
        return 0
    results = json.loads(json_path.read_text())
    results["kv_cache"] = kv
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    write_report(results, args.out, gpu)
    say(f"merged the KV section into {json_path} and {args.out}")
    print(json.dumps(kv["ratios"], indent=2))
    return 0


def _summary(path: Path) -> str:
    """The report's own `Summary:` paragraph, if it has one (those reports are written by hand)."""
    text = path.read_text()
    start = text.find("\nSummary:")
    if start < 0:
        return ""
    paragraph = text[start + len("\nSummary:") :].split("\n\n", 1)[0]
    return ": " + " ".join(paragraph.split())


def results_dir(report: Path) -> Path:
    """Where the report's generated companions go: docs/results/ beside docs/benchmarks.md."""
    return report.parent / "results"


def write_report(results: dict[str, Any], out: Path, gpu: dict[str, Any] | None = None) -> None:
    text = render_report(results)
    if gpu is not None:
        text = text.rstrip("\n") + "\n\n" + "\n".join(gpu_markdown(gpu)) + "\n"
    if "limits" in results.get("quantized", {}):
        q = results["quantized"]
        one = next((r["decode_tok_s"] for r in q["throughput"]["rows"] if r["sessions"] == 1), None)
        text += "\n" + "\n".join(limits_markdown(q["limits"], q["engine"], one)) + "\n"
    if "kv_cache" in results:
        text += "\n" + "\n".join(kv_markdown(results["kv_cache"])) + "\n"
    if "agent_suites" in results:
        text += "\n" + markdown_section(results["agent_suites"]) + "\n"
    others = sorted(p for p in results_dir(out).glob("bench-*.md") if p.name != "bench-core-redesign.md")
    if others:  # measured by their own commands (eval-eviction, eval-cluster, stress)
        text += "\n## Measured by other commands\n\n" + "".join(
            f"- [{p.name}]({p.relative_to(out.parent)}){_summary(p)}\n" for p in others
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def main(argv: list[str] | None = None) -> int:
    from dataclasses import replace

    from runtime import Engine

    args = parse(argv)
    json_path = args.json or results_dir(args.out) / "bench.json"
    gpu = json.loads(args.gpu_json.read_text()) if args.gpu_json.exists() else None
    if args.render_only:
        write_report(json.loads(json_path.read_text()), args.out, gpu)
        return 0
    say = lambda msg: print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    if args.only == "kv":
        return only_kv(args, json_path, gpu, say)
    cfg = QUICK if args.quick else BenchConfig()
    overrides = {
        k: v
        for k, v in {
            "doc_tokens": args.doc_tokens,
            "repeats": args.repeats,
            "session_rounds": args.session_rounds,
            "threads": args.threads,
            "peer_threads": args.peer_threads,
        }.items()
        if v is not None
    } | {"torchao_config": args.torchao_config or None}
    try:
        cfg = replace(cfg, peers=not args.no_peers, **overrides)
    except ValueError as e:  # a flag out of range: say which, before loading anything
        print(f"bench: {e}", file=sys.stderr)
        return 2
    say("loading the engine")
    engine = Engine(  # float32: the HF-identical row; the default (int4wo-32) is `run_quantized`'s
        dtype="float32",
        max_total_tokens=32768,
        max_running_requests=max(16, *cfg.sessions),
        num_threads=cfg.threads,
    )
    try:
        results = run_bench(engine, cfg, say)
        if not args.no_kv:
            say("KV cache dtype section")
            results["kv_cache"] = kv_section(args, engine.model_path, say)
        if not args.no_suites:
            from evals.suites.run import reduced_eval

            say("agent suites: cached vs uncached (reduced eval)")
            results["agent_suites"] = reduced_eval(engine, results_dir(args.out) / "eval")
    finally:
        engine.shutdown()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    write_report(results, args.out, gpu)
    say(f"wrote {args.out} and {json_path} in {results['duration_s']:.0f} s")
    print(json.dumps(results["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
