"""The `agents` eviction workload at small scale on the embedded engine with the real model.

Confirms the simulator's policy ordering with real prefill and real TTFT. One script (sessions,
steps, tool waits, one rollback per session, close) is planned once from a seed and replayed on
a fresh engine per policy (`engine.sibling`, same weights) whose KV pool is a fraction of the
script's peak working set. Requests run one at a time in a fixed, policy-independent order (a
session's next request becomes ready a few requests after its tool wait starts), so only the
cache differs between policies. Session events (tool_wait with an expected-return hint that is
sometimes missing, abandon on rollback, close) go to every engine; only `session` reads them.

Recomputed = prompt tokens not served from cache that an earlier request of the same run had
already computed (its prompt + output shares that prefix), i.e. ideal hits minus real hits. It is
the figure to compare: outputs are greedy and the order is fixed, so for `lru`, `lfu`, `slru` it
is exactly reproducible, and for `session` it moves only where wall-clock tool-wait estimates
flip a close decision; TTFT also carries the machine's load.

Scale: 16 sessions by default. With 6 (the first version) the pool at 50% of the peak working set
was barely more than the largest request (system + document + one session's context), so every
policy evicted nearly everything before each request and the result hinged on whether the single
document that fitted stayed: the policies tied on most seeds. With 16 sessions on 2 documents the
pool holds both documents and a few sessions' contexts, which is where the order matters.

    python -m evals.eviction.real --out out/eviction-real      (or: radixagent eval-eviction --real)
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WORDS = [
    "cache",
    "prefix",
    "token",
    "model",
    "agent",
    "tool",
    "session",
    "memory",
    "kernel",
    "request",
    "budget",
    "policy",
    "branch",
    "server",
    "latency",
    "report",
    "result",
    "search",
    "document",
    "section",
    "table",
    "value",
    "index",
    "node",
    "tree",
]
TOOLS = ("search", "run_code", "browse")


@dataclass(frozen=True, slots=True)
class RealConfig:
    sessions: int = 16
    steps: tuple[int, int] = (4, 5)
    documents: int = 2
    doc_words: int = 300  # ~330 tokens with the default tokenizer
    tool_words: tuple[int, int] = (30, 60)  # per tool result
    max_new_tokens: int = 4
    budget_fraction: float = 0.5
    policies: tuple[str, ...] = ("lru", "lfu", "slru", "session")
    stagger: int = 2  # requests between session starts
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 2 or not 2 <= self.steps[0] <= self.steps[1]:
            raise ValueError("need >= 2 sessions and 2 <= MIN <= MAX steps")
        if not 0 < self.budget_fraction <= 1:
            raise ValueError("budget_fraction must be in (0, 1]")


@dataclass(slots=True)
class Step:
    text: list[int]  # appended to the context before the request (tool result / user turn)
    wait: int  # requests by others before this session's next request is ready
    hint: bool  # whether tool_wait carries expected_s
    rollback: bool  # after this request: abandon it (tool result + answer) and retry


@dataclass(slots=True)
class Script:
    sid: str
    doc: int
    prefix: list[int]  # system + document + task
    shared: int  # length of system + document (shared with the other sessions on this document)
    steps: list[Step] = field(default_factory=list)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def plan(cfg: RealConfig, tokenize) -> tuple[list[Script], list[tuple[int, int]]]:
    """Scripts and the replay order [(session index, step index)], both policy-independent."""
    rng = random.Random(cfg.seed)
    system = tokenize(
        "You are a careful research agent. Use the tools, cite sections, answer briefly.\n"
        + _words(rng, 60)
        + "\n"
    )
    docs = [tokenize(f"Document {d}:\n" + _words(rng, cfg.doc_words) + "\n") for d in range(cfg.documents)]
    scripts = []
    for s in range(cfg.sessions):
        doc = s % cfg.documents
        task = tokenize(f"Task {s}: " + _words(rng, 12) + "\n")
        script = Script(f"real-{cfg.seed}-{s}", doc, system + docs[doc] + task, len(system) + len(docs[doc]))
        n = rng.randint(*cfg.steps)
        back = rng.randint(1, n - 2) if n >= 3 else -1
        for k in range(n):
            tool = rng.choice(TOOLS)
            text = tokenize(f"\n[{tool} result] " + _words(rng, rng.randint(*cfg.tool_words)) + "\nNext:")
            script.steps.append(Step(text, rng.randint(1, 6), rng.random() > 0.2, k == back))
        scripts.append(script)
    return scripts, _order(cfg, scripts)


def _order(cfg: RealConfig, scripts: list[Script]) -> list[tuple[int, int]]:
    ready = [(s * cfg.stagger, s, 0) for s in range(len(scripts))]
    heapq.heapify(ready)
    order, tick = [], 0
    while ready:
        at, s, k = heapq.heappop(ready)
        tick = max(tick, at)
        order.append((s, k))
        tick += 1
        if k + 1 < len(scripts[s].steps):
            heapq.heappush(ready, (tick + scripts[s].steps[k].wait, s, k + 1))
    return order


def peak_working_set(cfg: RealConfig, scripts: list[Script], order: list[tuple[int, int]]) -> tuple[int, int]:
    """(peak distinct live tokens, largest single request), assuming full-length outputs."""
    live: dict[int, int] = {}  # session -> unique live tokens past system + document
    peak = biggest = 0
    for s, k in order:
        sc, step = scripts[s], scripts[s].steps[k]
        ctx = live.get(s, len(sc.prefix) - sc.shared)
        biggest = max(biggest, sc.shared + ctx + len(step.text) + cfg.max_new_tokens)
        live[s] = ctx if step.rollback else ctx + len(step.text) + cfg.max_new_tokens
        docs = {scripts[o].doc: scripts[o].shared for o in live}
        peak = max(peak, sum(docs.values()) + sum(live.values()) + cfg.max_new_tokens)
        if k + 1 == len(scripts[s].steps):
            del live[s]
    return peak, biggest


def pool_tokens(cfg: RealConfig, peak: int, biggest: int) -> tuple[int, bool]:
    """(KV pool size, whether it sits at the floor of one largest request, leaving no choice)."""
    floor = biggest + 16
    pool = int(cfg.budget_fraction * peak)
    return max(pool, floor), pool <= floor


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def replay(engine: Any, cfg: RealConfig, scripts: list[Script], order: list[tuple[int, int]]) -> list[dict]:
    """Run the script on `engine`; one record per request."""
    ctx = {s: list(sc.prefix) for s, sc in enumerate(scripts)}
    seen: list[list[int]] = []
    records, durations = [], []
    params = {"max_new_tokens": cfg.max_new_tokens, "temperature": 0.0}
    for s, k in order:
        sc, step = scripts[s], scripts[s].steps[k]
        if k == 0:
            engine.session_event(sc.sid, "open")
        prompt = ctx[s] + step.text
        ideal = min(len(prompt) - 1, max((_lcp(prompt, q) for q in seen), default=0))
        started = time.perf_counter()
        out = engine.generate(input_ids=prompt, sampling_params=params, session_id=sc.sid)
        durations.append(time.perf_counter() - started)
        meta, full = out["meta_info"], prompt + out["output_ids"]
        seen.append(full)
        records.append(
            {
                "session": sc.sid,
                "step": k,
                "prompt_tokens": len(prompt),
                "cached_tokens": meta["cached_tokens"],
                "ideal_cached_tokens": ideal,
                "ttft_s": meta["ttft"],
                "latency_s": durations[-1],
            }
        )
        if step.rollback:
            engine.session_event(sc.sid, "abandon", input_ids=full, keep=len(ctx[s]))
        else:
            ctx[s] = full
        if k + 1 == len(sc.steps):
            engine.session_event(sc.sid, "close")
        else:
            hint = step.wait * statistics.fmean(durations) if step.hint else None
            engine.session_event(sc.sid, "tool_wait", tool=TOOLS[k % len(TOOLS)], expected_s=hint)
    return records


def summarize(policy: str, records: list[dict], stats: dict, seconds: float) -> dict:
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    ttft = [r["ttft_s"] for r in records]
    return {
        "policy": policy,
        "requests": len(records),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "ideal_cached_tokens": sum(r["ideal_cached_tokens"] for r in records),
        "recomputed_tokens": sum(max(0, r["ideal_cached_tokens"] - r["cached_tokens"]) for r in records),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_mean_s": statistics.fmean(ttft),
        "evicted_tokens": stats["evicted_tokens"],
        "seconds": seconds,
    }


def run(cfg: RealConfig, engine: Any | None = None, log=print) -> dict:
    """Plan, size the pool, replay once per policy. `engine` (optional) supplies the weights."""
    from runtime import Engine

    own = engine is None
    base = engine if engine is not None else Engine(max_total_tokens=4096)
    try:
        scripts, order = plan(cfg, base.tokenize)
        peak, biggest = peak_working_set(cfg, scripts, order)
        pool, floored = pool_tokens(cfg, peak, biggest)
        if floored:
            log(
                f"warning: the pool ({pool} tokens) only holds the largest request ({biggest}): "
                "no policy has a choice; use more sessions or a larger --budget"
            )
        base.generate(input_ids=scripts[0].prefix[:64], sampling_params={"max_new_tokens": 1})  # warm-up
        rows = []
        for policy in cfg.policies:
            eng = base.sibling(radix_eviction_policy=policy, max_total_tokens=pool)
            try:
                started = time.perf_counter()
                records = replay(eng, cfg, scripts, order)
                eng.check_integrity()
                rows.append(summarize(policy, records, eng.get_cache_stats(), time.perf_counter() - started))
            finally:
                eng.shutdown()
            log(_row_line(rows[-1]))
        return {
            "config": asdict(cfg),
            "model": base.model_name,
            "peak_working_set": peak,
            "largest_request": biggest,
            "pool_tokens": pool,
            "pool_floored": floored,
            "budget_definition": "KV pool = max(budget_fraction x peak working set, largest request + 16); peak working set "
            "= most distinct tokens on live, non-abandoned contexts of open sessions (+ one output)",
            "rows": rows,
        }
    finally:
        if own:
            base.shutdown()


def _row_line(r: dict) -> str:
    return (
        f"{r['policy']:>8}: recomputed {r['recomputed_tokens']:>6}  hit {r['hit_rate']:.3f}  "
        f"ttft p50 {r['ttft_p50_s'] * 1000:.0f} ms  mean {r['ttft_mean_s'] * 1000:.0f} ms  "
        f"({r['requests']} req, {r['seconds']:.1f} s)"
    )


def report(results: dict) -> str:
    lines = [
        f"Model {results['model']}; {results['config']['sessions']} sessions, "
        f"{results['rows'][0]['requests']} requests; peak working set {results['peak_working_set']} tokens, "
        f"pool {results['pool_tokens']} tokens (largest request {results['largest_request']}"
        f"{'; floored: no policy has a choice' if results.get('pool_floored') else ''}).",
        "",
        "| policy | prompt tokens | cached | hit rate | recomputed | TTFT p50 (ms) | TTFT mean (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['policy']} | {r['prompt_tokens']:,} | {r['cached_tokens']:,} | {r['hit_rate']:.3f} | "
            f"{r['recomputed_tokens']:,} | {r['ttft_p50_s'] * 1000:.0f} | {r['ttft_mean_s'] * 1000:.0f} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m evals.eviction.real", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/eviction-real"))
    default = RealConfig()
    p.add_argument("--sessions", type=int, default=default.sessions)
    p.add_argument(
        "--budget", type=float, default=default.budget_fraction, help="fraction of peak working set"
    )
    p.add_argument("--policies", default=",".join(default.policies))
    p.add_argument("--steps", default=",".join(map(str, default.steps)), help="MIN,MAX steps per session")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    lo, hi = (int(x) for x in args.steps.split(","))
    cfg = RealConfig(
        sessions=args.sessions,
        budget_fraction=args.budget,
        seed=args.seed,
        steps=(lo, hi),
        policies=tuple(p for p in args.policies.split(",") if p),
    )
    results = run(cfg)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "report.md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
