"""`radixagent eval-cluster`: router policies compared on a local cluster of `radixagent serve` workers.

Workload (agent-like, plain backend calls): S concurrent sessions share one long document head; each
session makes `steps` model calls whose prompt is the head + the session's growing log (task, the
model's previous outputs, a tool result), sleeping a seeded "tool wait" (uniform in `--tool-wait
MIN,MAX` seconds) between calls. Greedy,
small `max_new_tokens`. Every request carries its session id (body `session_id` + the
`X-SMG-Routing-Key` header our SGLang backend adds); only the router policy differs per mode:

- `round_robin`, `cache_aware`: the router ignores the header.
- `session` ("cache-aware + session affinity"): sticky by routing key, new keys to the worker with
  the fewest active keys (`--assignment-mode min_group`). On smg (`--router smg`, what `auto` picks
  when installed) that is `--policy cache_aware --routing-key-override`; on sglang-router 0.3.2 its
  `manual` policy. The eval's requests all carry a key, so the two behave alike here.
- `single` (baseline): one worker with the cluster's total KV budget.

The workers stay up across modes (their caches are flushed, the router is replaced), so the numbers
compare routing only. Output: results.json, report.md, cluster.png, calls.jsonl in --out.

Token accounting per call (issue 5's definition, as in evals/eviction): `ideal` = the longest common
token-id prefix between this prompt and the prompt of any call of the same mode that had completed
before this one was sent, capped at prompt_tokens - 1 (the engine never serves a prompt's last
token from the cache, SGLang's rule). Prompts are tokenized after the run through a worker's
/tokenize (the ids /generate uses), so the run itself is untouched.
- recomputed prefill tokens = max(0, ideal - cached): tokens an earlier request had computed that
  this one computed again (routing to a worker without them, eviction).
- new prompt tokens = prompt - max(ideal, cached): tokens no finished request had computed (the new
  tool result and output, a first prefill of the document); every policy pays them.
- uncached prompt tokens = prompt - cached = recomputed + new.
Output tokens are not counted in `ideal`: the log puts "Step k:" before the previous output, so the
next prompt never continues a previous prompt + output token sequence.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from evals.suites.metrics import percentile
from runtime.cluster.cluster import (
    ROUTERS,
    Cluster,
    ClusterConfig,
    ClusterError,
    policy_flags,
    resolve_router,
    router_available,
    router_version,
)

ROUTED_MODES = ("round_robin", "cache_aware", "session")
LABELS = {
    "round_robin": "round_robin",
    "cache_aware": "cache_aware",
    "session": "cache-aware + session affinity (manual, X-SMG-Routing-Key)",
    "single": "single worker, same total KV",
}
#: the `session` label per router (LABELS["session"] is sglang-router's)
SESSION_LABELS = {
    "sglang-router": LABELS["session"],
    "smg": "cache-aware + session affinity (cache_aware + routing-key override, X-SMG-Routing-Key)",
}


@dataclass(frozen=True, slots=True)
class Workload:
    workers: int = 2
    sessions: int = 16
    steps: int = 4
    doc_sentences: int = 60
    kv_per_worker: int = 4096
    max_new_tokens: int = 8
    #: lines per tool result (~30 tokens each): how much per-session state each step adds
    tool_lines: int = 1
    tool_wait_s: tuple[float, float] = (0.2, 1.0)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 8 or self.sessions < 1 or self.steps < 1:
            raise ValueError("need 1-8 workers, >= 1 session, >= 1 step")
        lo, hi = self.tool_wait_s
        if not 0 <= lo <= hi:
            raise ValueError(f"tool waits need 0 <= MIN <= MAX seconds, got {lo},{hi}")


@dataclass(slots=True)
class Call:
    session: int
    step: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    latency_s: float
    #: client-side monotonic times: request sent, answer received
    sent: float = 0.0
    done: float = 0.0
    prompt: str = ""
    #: filled after the run (account_calls)
    ideal_cached_tokens: int = 0
    recomputed_tokens: int = 0
    new_tokens: int = 0


def common_prefix_len(a: Any, b: Any) -> int:
    """Length of the common leading run of two token-id sequences."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def ideal_cached(ids: list[list[int]], sent: list[float], done: list[float]) -> list[int]:
    """Per call: the longest token prefix that a call completed before it was sent had computed."""
    arrays = [np.asarray(x) for x in ids]
    out = []
    for i in range(len(arrays)):
        best = 0
        for j in range(len(arrays)):
            if j != i and done[j] < sent[i] and len(arrays[j]) > best:
                best = max(best, common_prefix_len(arrays[i], arrays[j]))
        out.append(best)
    return out


def split_uncached(prompt_tokens: int, cached: int, ideal: int) -> tuple[int, int, int]:
    """(ideal capped at prompt-1, recomputed, new): recomputed + new == prompt - cached."""
    ideal = max(0, min(ideal, prompt_tokens - 1))
    return ideal, max(0, ideal - cached), prompt_tokens - max(ideal, cached)


def tokenize(url: str, prompts: list[str], batch: int = 16) -> list[list[int]]:
    """Token ids as /generate computes them (no special tokens), from a worker's /tokenize."""
    ids: list[list[int]] = []
    with httpx.Client(timeout=300) as client:
        for k in range(0, len(prompts), batch):
            resp = client.post(
                url + "/tokenize", json={"prompt": prompts[k : k + batch], "add_special_tokens": False}
            )
            resp.raise_for_status()
            ids += resp.json()["tokens"]
    return ids


def account_calls(calls: list[Call], ids: list[list[int]]) -> int:
    """Fill each call's ideal / recomputed / new tokens; returns how many token counts disagree with the server's."""
    ideals = ideal_cached(ids, [c.sent for c in calls], [c.done for c in calls])
    mismatches = 0
    for c, toks, ideal in zip(calls, ids, ideals, strict=True):
        mismatches += len(toks) != c.prompt_tokens
        c.ideal_cached_tokens, c.recomputed_tokens, c.new_tokens = split_uncached(
            c.prompt_tokens, c.cached_tokens, ideal
        )
    return mismatches


def document(n: int) -> str:
    return "Operations manual of the harbour authority.\n" + "\n".join(
        f"Section {i}: berth {i % 11} handles vessels up to {40 + i * 3} metres; the pilot on duty "
        f"for sector {i % 5} reports tide level {i % 9} at shift change."
        for i in range(n)
    )


def tool_result(session: int, step: int, lines: int = 1) -> str:
    berth = (session + step) % 11
    rows = "".join(
        f"berth {berth} slot {k}: vessel S{session}-{step}-{k}, departs at {8 + step + k}:00, "
        f"pilot {(session * 3 + k) % 5}.\n"
        for k in range(lines)
    )
    return f"\n[tool lookup(berth={berth})]\n{rows}"


def run_session(backend: Any, w: Workload, doc: str, session: int, start: float) -> list[Call]:
    rng = random.Random(w.seed * 1000 + session)
    time.sleep(max(0.0, start - time.monotonic()) + rng.uniform(0.0, 1.0))  # staggered arrivals
    log = f"\n\n## Session {session}\nTask: which vessels use berth {session % 11} today?\n"
    sid = f"eval-s{session}"
    calls: list[Call] = []
    for step in range(w.steps):
        sent = time.monotonic()
        out = backend.generate(
            prompt=doc + log,
            session_id=sid,
            sampling_params={"temperature": 0.0, "max_new_tokens": w.max_new_tokens},
        )
        calls.append(
            Call(
                session,
                step,
                out.prompt_tokens,
                out.cached_tokens,
                out.ttft_s,
                out.latency_s,
                sent=sent,
                done=time.monotonic(),
                prompt=doc + log,
            )
        )
        log += f"Step {step}: {out.text.strip()}" + tool_result(session, step, w.tool_lines)
        time.sleep(rng.uniform(*w.tool_wait_s))  # the tool runs; the session's KV waits
    return calls


def run_mode(cluster: Cluster, w: Workload, mode: str, say: Any, calls_out: Any = None) -> dict[str, Any]:
    from runtime import connect

    cluster.flush()
    before = cluster.worker_stats()
    backend = connect(cluster.url, max_attempts=4)
    doc = document(w.doc_sentences)
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=w.sessions) as pool:
            futures = [pool.submit(run_session, backend, w, doc, s, started) for s in range(w.sessions)]
            calls = [c for f in futures for c in f.result()]
    finally:
        backend.close()
    wall = time.monotonic() - started
    workers = per_worker(before, cluster.worker_stats())
    calls.sort(key=lambda c: c.sent)
    mismatches = account_calls(calls, tokenize(cluster.worker_urls[0], [c.prompt for c in calls]))
    row = summarize(mode, calls, wall, workers)
    kind = cluster.resolve_router()
    if mode == "session":
        row["label"] = SESSION_LABELS[kind]
    row["router_flags"] = list(policy_flags(cluster.config.policy, kind, cluster.config.sticky_sessions))
    row["tokenize_mismatches"] = mismatches
    if calls_out is not None:
        for c in calls:
            rec = {k: v for k, v in asdict(c).items() if k != "prompt"}
            calls_out.write(
                json.dumps({"mode": mode, **rec, "sent": c.sent - started, "done": c.done - started}) + "\n"
            )
    say(
        f"  {mode:<12} hit {row['hit_rate']:.3f}  recomputed {row['recomputed_prefill_tokens']:>6}  "
        f"uncached {row['uncached_prompt_tokens']:>6}  new {row['new_prompt_tokens']:>6}  "
        f"ttft p50 {row['ttft_p50_s']:.3f}s p95 {row['ttft_p95_s']:.3f}s  per-worker {row['requests_per_worker']}"
        + (f"  ({mismatches} token-count mismatches)" if mismatches else "")
    )
    return row


def per_worker(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("requests", "prompt_tokens", "cached_tokens", "evicted_tokens")
    return [
        {"url": a["url"], **{k: int(a.get(k, 0)) - int(b.get(k, 0)) for k in keys}}
        for b, a in zip(before, after, strict=True)
    ]


def summarize(mode: str, calls: list[Call], wall: float, workers: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(c.prompt_tokens for c in calls)
    cached = sum(c.cached_tokens for c in calls)
    ttfts = [c.ttft_s for c in calls]
    follow = [c for c in calls if c.step > 0]
    reqs = [wk["requests"] for wk in workers]
    return {
        "mode": mode,
        "label": LABELS[mode],
        "requests": len(calls),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "follow_up_hit_rate": sum(c.cached_tokens for c in follow)
        / max(1, sum(c.prompt_tokens for c in follow)),
        "recomputed_prefill_tokens": sum(c.recomputed_tokens for c in calls),
        "uncached_prompt_tokens": prompt - cached,
        "new_prompt_tokens": sum(c.new_tokens for c in calls),
        "ideal_cached_tokens": sum(c.ideal_cached_tokens for c in calls),
        "recomputed_by_step": [
            sum(c.recomputed_tokens for c in calls if c.step == k)
            for k in range(1 + max((c.step for c in calls), default=-1))
        ],
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "e2e_s": wall,
        "requests_per_worker": reqs,
        "evicted_tokens_per_worker": [wk["evicted_tokens"] for wk in workers],
        "load_imbalance": max(reqs) / max(1, min(reqs)) if reqs else None,
        "workers": workers,
    }


def run_all(
    w: Workload, modes: list[str], log_dir: Path, say: Any, calls_out: Any = None, router: str = "auto"
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    routed = [m for m in modes if m in ROUTED_MODES]
    if routed:
        cfg = ClusterConfig(
            workers=w.workers,
            policy=routed[0],
            router=router,
            log_dir=str(log_dir / "cluster"),
            worker_args=("--max-total-tokens", str(w.kv_per_worker)),
            # the baselines stay the routers' plain policies (`session` pins keys by itself)
            sticky_sessions=False,
        )
        say(f"starting {w.workers} workers x {w.kv_per_worker} KV tokens ...")
        with Cluster(cfg) as cluster:
            for mode in routed:
                if mode != cluster.config.policy:
                    cluster.restart_router(mode)
                rows.append(run_mode(cluster, w, mode, say, calls_out))
    if "single" in modes:
        cfg = ClusterConfig(
            workers=1,
            policy="round_robin",
            router=router,
            log_dir=str(log_dir / "single"),
            worker_args=("--max-total-tokens", str(w.kv_per_worker * w.workers)),
            threads_per_worker=None,
        )
        say(f"starting the single-worker baseline ({w.kv_per_worker * w.workers} KV tokens) ...")
        with Cluster(cfg) as cluster:
            rows.append(run_mode(cluster, w, "single", say, calls_out))
    return rows


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["mode"]: r for r in rows}
    out: dict[str, Any] = {}
    if "session" in by and "round_robin" in by:
        rr, s = by["round_robin"]["recomputed_prefill_tokens"], by["session"]["recomputed_prefill_tokens"]
        out["recomputed_round_robin"], out["recomputed_session"] = rr, s
        # None when session affinity recomputed nothing (the ratio is unbounded)
        out["recompute_reduction_vs_round_robin"] = rr / s if s else None
        out["meets_1_5x_fewer_recomputed"] = rr > 0 and rr >= 1.5 * s
        ru, su = by["round_robin"]["uncached_prompt_tokens"], by["session"]["uncached_prompt_tokens"]
        out["uncached_reduction_vs_round_robin"] = ru / max(1, su)  # the old, floor-bound ratio
    if "session" in by and "single" in by:
        gap = by["single"]["hit_rate"] - by["session"]["hit_rate"]
        out["hit_rate_gap_vs_single"] = gap
        out["meets_within_5pct_of_single"] = gap <= 0.05
    return out


def report(w: Workload, rows: list[dict[str, Any]], checks: dict[str, Any], quick: bool, router: str) -> str:
    """`router`: the router and its version as run, e.g. "smg 1.13.0"."""
    lines = [
        "# Cluster routing: round_robin vs cache_aware vs session affinity",
        "",
        f"{w.workers} `radixagent serve` workers x {w.kv_per_worker} KV tokens behind {router}; "
        f"{w.sessions} concurrent sessions x {w.steps} steps sharing one {w.doc_sentences}-sentence document, "
        f"{w.tool_lines}-line tool results, tool waits uniform in {w.tool_wait_s[0]}-{w.tool_wait_s[1]} s, greedy, "
        f"max_new_tokens {w.max_new_tokens}, seed {w.seed}.",
    ]
    if quick:
        lines.append(
            "**Quick run** on a small CPU machine (2 cores shared): small model, few sessions; "
            "TTFT is dominated by CPU contention between the workers, hit rates and recomputed "
            "tokens are the meaningful numbers."
        )
    flags = {r["mode"]: " ".join(r["router_flags"]) for r in rows if r.get("router_flags")}
    if flags:
        lines += ["", "Router flags per mode: " + "; ".join(f"{m}: `{f}`" for m, f in flags.items()) + "."]
    lines += [
        "",
        "- **recomputed**: prompt tokens not served from cache that a request completed before this one "
        "was sent had already computed (token-exact common prefix, capped at prompt - 1): the cost routing "
        "and eviction add.",
        "- **new**: prompt tokens no completed request had computed (each step's tool result and output, "
        "first prefills of the document): every policy pays them.",
        "- **uncached** = prompt - cached = recomputed + new (what earlier versions of this report called "
        "recomputed).",
        "",
        "| mode | requests | hit rate | follow-up hit rate | recomputed prefill | new prompt | uncached prompt "
        "| TTFT p50 | TTFT p95 | requests per worker | tokens evicted per worker | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['requests']} | {r['hit_rate']:.3f} | {r['follow_up_hit_rate']:.3f} "
            f"| {r['recomputed_prefill_tokens']} | {r['new_prompt_tokens']} | {r['uncached_prompt_tokens']} "
            f"| {r['ttft_p50_s']:.3f} s | {r['ttft_p95_s']:.3f} s | {r['requests_per_worker']} "
            f"| {r['evicted_tokens_per_worker']} | {r['e2e_s']:.1f} s |"
        )
    lines += [
        "",
        "Recomputed prefill tokens by step: "
        + ", ".join(f"{r['mode']} {r['recomputed_by_step']}" for r in rows),
    ]
    bad = {r["mode"]: r["tokenize_mismatches"] for r in rows if r.get("tokenize_mismatches")}
    if bad:
        lines += [
            "",
            f"Token-count mismatches between /tokenize and /generate (accounting approximate): {bad}",
        ]
    lines += [
        "",
        "Checks (issue 9 targets; recompute reduction uses the recomputed column): " + json.dumps(checks),
        "",
    ]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["mode"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].bar(names, [r["hit_rate"] for r in rows], color="tab:green")
    axes[0].set_title("aggregate hit rate")
    rec = [r["recomputed_prefill_tokens"] for r in rows]
    axes[1].bar(names, rec, color="tab:red", label="recomputed (computed before)")
    axes[1].bar(
        names,
        [r["new_prompt_tokens"] for r in rows],
        bottom=rec,
        color="tab:gray",
        label="new (never computed)",
    )
    axes[1].set_title("uncached prompt tokens")
    axes[1].legend(fontsize=8)
    x = range(len(rows))
    axes[2].bar([i - 0.2 for i in x], [r["ttft_p50_s"] for r in rows], width=0.4, label="p50")
    axes[2].bar([i + 0.2 for i in x], [r["ttft_p95_s"] for r in rows], width=0.4, label="p95")
    axes[2].set_xticks(list(x), names)
    axes[2].set_title("TTFT (s)")
    axes[2].legend()
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="radixagent eval-cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--kv-per-worker", type=int, default=4096, help="KV pool of each worker, tokens")
    p.add_argument("--modes", default="round_robin,cache_aware,session,single")
    p.add_argument(
        "--quick", action="store_true", help="2 workers x 16 sessions x 4 steps (small CPU machines)"
    )
    p.add_argument("--tool-lines", type=int, default=1, help="lines per tool result (~30 tokens each)")
    p.add_argument(
        "--tool-wait",
        type=_wait_range,
        default=(0.2, 1.0),
        metavar="MIN,MAX",
        help="seconds each session sleeps after a call (its tool running), uniform in "
        "[MIN, MAX]; default 0.2,1.0",
    )
    p.add_argument(
        "--router",
        default="auto",
        choices=("auto", *ROUTERS),
        help="router package; auto: smg if installed, else sglang-router",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/cluster")
    return p.parse_args(argv)


def _wait_range(text: str) -> tuple[float, float]:
    """`MIN,MAX` (or one number for a fixed wait) -> (min, max) seconds."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {text!r}") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 0 <= parts[0] <= parts[1]:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds with 0 <= MIN <= MAX, got {text!r}")
    return parts[0], parts[1]


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    try:
        kind = resolve_router(ns.router)
    except ClusterError as exc:
        print(f"radixagent eval-cluster: {exc}", file=sys.stderr)
        return 2
    if not router_available(kind):
        print(f"radixagent eval-cluster: needs {kind} (pip install {kind})", file=sys.stderr)
        return 2
    if ns.quick:
        ns.workers, ns.sessions, ns.steps = 2, 16, 4
    w = Workload(
        workers=ns.workers,
        sessions=ns.sessions,
        steps=ns.steps,
        kv_per_worker=ns.kv_per_worker,
        tool_lines=ns.tool_lines,
        tool_wait_s=ns.tool_wait,
        seed=ns.seed,
    )
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def say(msg: str) -> None:
        with lock:
            print(msg, flush=True)

    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    unknown = set(modes) - set(LABELS)
    if unknown:
        print(
            f"radixagent eval-cluster: unknown modes {sorted(unknown)}; known: {sorted(LABELS)}",
            file=sys.stderr,
        )
        return 2
    with open(out / "calls.jsonl", "w") as calls_out:
        rows = run_all(w, modes, out / "logs", say, calls_out, router=kind)
    checks = verdict(rows)
    router = f"{kind} {router_version(kind)}"
    results = {
        "workload": asdict(w),
        "quick": ns.quick,
        "router": router,
        "router_package": kind,
        "tool_wait_s": list(w.tool_wait_s),
        "rows": rows,
        "checks": checks,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(report(w, rows, checks, ns.quick, router))
    plot(rows, out / "cluster.png")
    say(f"wrote {out}/results.json, report.md, cluster.png, calls.jsonl; checks {checks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
