"""KV tier benchmarks (issue #24): `python -m evals.benchmarks.bench_tier [--out docs/results/bench-tier.md]`.

Sections, all in one process and run (ratios compare numbers taken minutes apart on a shared
CPU: read them as ratios, not absolute times):
- reload: a ~2k-token prefix recomputed (cold) vs loaded from the file tier (after eviction)
  vs served from the pool; greedy outputs compared; write_back vs write_through cost.
- writer: the eviction-time stall on the engine thread (evicting a ~2k-token prefix), writes
  synchronous (`hicache_write_queue_mb=0`) vs queued to the background writer.
- prefetch: a session's ~2k-token prefix is evicted by another tenant's request while the
  session waits on its tool; TTFT of its first step after the tool returns, prefetch on vs off,
  with what was resident just before the resume and how many tokens the step computed.
- cluster: two in-process workers (sibling engines over one set of weights), every session
  step routed to the other worker: hit rate with a shared Redis tier vs without any tier.
- cluster-procs: the same through real `radixagent cluster` processes (2 `radixagent serve`
  workers behind the router with `round_robin`, so each session's consecutive steps land on
  alternate workers) sharing one private redis-server; skipped with a message when
  redis-server or the router is missing.
- real: the eviction benchmark's `agents` workload at small scale on the real engine
  (evals/eviction/real.py, tight pool): recomputed prefill tokens with the tier off vs on.
- eviction: the eviction simulator's agents workload (64 sessions, 25%/50% budgets) with the
  tier modelled in the simulator (evals/eviction/tier_sim.py), tier off vs on vs the oracle.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GREEDY = {"temperature": 0, "max_new_tokens": 8}


def _evict_all(eng: Any) -> None:
    with eng.scheduler.lock:
        eng.cache.evict(eng.cache.evictable_size)


def _ttft(eng: Any, ids: list[int], **kw: Any) -> tuple[float, dict]:
    r = eng.generate(input_ids=ids, sampling_params=GREEDY, **kw)
    return r["meta_info"]["ttft"], r


def _prompt(engine: Any, tokens: int) -> list[int]:
    from evals.benchmarks.bench import essay_documents

    return essay_documents(engine.tokenize, 1, tokens)[0] + engine.tokenize("\n\nQuestion: what is it about?")


def reload_section(engine: Any, tier_dir: Path, tokens: int, repeats: int, say: Callable) -> dict:
    ids = _prompt(engine, tokens)
    eng = engine.sibling(
        enable_hierarchical_cache=True,
        hicache_storage_dir=str(tier_dir / "reload"),
        max_total_tokens=4 * tokens,
    )
    cold, tier, pool, same = [], [], [], []
    try:
        for _ in range(repeats):
            t, c = _ttft(eng, ids, prefix_cache=False)
            cold.append(t)
            eng.generate(input_ids=ids, sampling_params=GREEDY)  # computed once, published
            _evict_all(eng)  # demoted (write_back)
            t, r = _ttft(eng, ids)
            tier.append(t)
            assert r["meta_info"]["cached_tokens_details"]["storage"] > 0, "no tier hit"
            t, p = _ttft(eng, ids)
            pool.append(t)
            same.append(c["output_ids"] == r["output_ids"] == p["output_ids"])
            say(f"reload: cold {cold[-1]:.2f}s tier {tier[-1]:.3f}s pool {pool[-1]:.3f}s")
        stats = eng.get_cache_stats()
        footprint = eng.tier.tier.store.footprint()
    finally:
        eng.shutdown()
    med = statistics.median
    loaded = r["meta_info"]["cached_tokens_details"]["storage"]
    return {
        "prompt_tokens": len(ids),
        "loaded_tokens": loaded,
        "ttft_cold_s": med(cold),
        "ttft_tier_s": med(tier),
        "ttft_pool_s": med(pool),
        "speedup_tier_vs_cold": med(cold) / med(tier),
        "outputs_identical": all(same),
        "tier_load_time_s_per_hit": stats["tier_load_time_s"] / max(1, stats["tier_hits"]),
        "tier_write_time_s_per_page": stats["tier_write_time_s"] / max(1, stats["tier"]["demoted_pages"]),
        "disk_bytes_per_token": footprint["bytes"]
        / max(1, footprint["entries"] * eng.tier.tier.config.page_tokens),
        "pool_bytes_per_token": eng.kv_bytes_per_token,
        "disk_footprint": footprint,
        "write_policy": _write_policies(engine, ids, tier_dir, say),
    }


def _write_policies(engine: Any, ids: list[int], tier_dir: Path, say: Callable) -> dict:
    """First-request TTFT and write time: write_through pays the writes on the request path."""
    out = {}
    for policy in ("write_back", "write_through"):
        eng = engine.sibling(
            enable_hierarchical_cache=True,
            hicache_storage_dir=str(tier_dir / policy),
            hicache_write_policy=policy,
            max_total_tokens=4 * len(ids),
        )
        try:
            t, _ = _ttft(eng, ids)
            out[policy] = {"ttft_first_s": t, "write_time_s": eng.get_cache_stats()["tier_write_time_s"]}
        finally:
            eng.shutdown()
        say(f"{policy}: first TTFT {t:.2f}s, writes {out[policy]['write_time_s']:.3f}s")
    return out


def _other_prompt(engine: Any, tokens: int) -> list[int]:
    """Another tenant's prompt of the same length (the next essays: no shared prefix)."""
    from evals.benchmarks.bench import essay_documents

    return essay_documents(engine.tokenize, 2, tokens)[1] + engine.tokenize("\n\nSummarize it.")


def _landing(
    eng: Any, ids: list[int], began: float, until_s: float, above: int, poll_s: float
) -> float | None:
    """Polls until `until_s` after `began`: seconds until more than `above` tokens of `ids` were
    resident (the prefetch landed), or None."""
    landed = None
    while time.monotonic() - began < until_s:
        if landed is None and _resident(eng, ids) > above:
            landed = time.monotonic() - began
        time.sleep(poll_s)
    return landed


def _resident(eng: Any, ids: list[int]) -> int:
    with eng.scheduler.lock:
        return eng.cache.cached_length(ids)


def _prefetch_engines(engine: Any, tier_dir: Path, tokens: int) -> dict[str, Any]:
    """The prefetch-on and prefetch-off siblings over one tier directory, each with a pool of
    1.5x the prefix."""
    return {
        mode: engine.sibling(
            enable_hierarchical_cache=True,
            hicache_storage_dir=str(tier_dir / "prefetch"),
            hicache_prefetch=mode == "on",
            radix_eviction_policy="session",
            max_total_tokens=int(1.5 * tokens) + 64,
        )
        for mode in ("on", "off")
    }


def _prefetch_warm_up(engines: dict[str, Any], ids: list[int], other: list[int]) -> list[int]:
    """Both prompts computed once, stored, loaded by the other engine; the session's context
    (its prompt and first answer)."""
    ctx: list[int] = []
    for eng in engines.values():
        first = eng.generate(input_ids=ids, sampling_params=GREEDY, session_id="s")
        eng.generate(input_ids=other, sampling_params=GREEDY, session_id="o")
        _evict_all(eng)
        eng.tier.tier.flush(120)
        ctx = ids + first["output_ids"]
    return ctx


def _prefetch_round(
    eng: Any, ctx: list[int], step: list[int], other: list[int], wait_s: float
) -> dict[str, Any]:
    """One round on one engine: s's turn, its tool wait while the other tenant's request evicts
    it, then the TTFT of its next step."""
    eng.generate(input_ids=ctx, sampling_params=GREEDY, session_id="s")  # s's turn: resident
    before = eng.get_cache_stats()["tier"]["prefetches"]
    began = time.monotonic()
    eng.session_event("s", "tool_wait", expected_s=wait_s)
    o = eng.generate(input_ids=other, sampling_params=GREEDY, session_id="o")  # evicts s
    after_other = _resident(eng, step)
    landed = _landing(eng, step, began, wait_s + 0.3, after_other, 0.05)  # the tool "runs"
    resident = _resident(eng, step)
    eng.session_event("s", "resume")
    t, r = _ttft(eng, step, session_id="s")
    meta = r["meta_info"]
    return {
        "ttft_s": t,
        "other_request_s": o["meta_info"]["e2e_latency"],
        "resident_after_other": after_other,
        "resident_before_resume": resident,
        "prefetch_landed_s": landed,
        "prefetches": eng.get_cache_stats()["tier"]["prefetches"] - before,
        "computed_tokens": len(step) - meta["cached_tokens"],
        "details": meta["cached_tokens_details"],
    }


def prefetch_section(engine: Any, tier_dir: Path, tokens: int, repeats: int, say: Callable) -> dict:
    """Session `s` holds a ~2k-token context; it calls a tool (`tool_wait`, expected `WAIT_S`)
    and another tenant's ~2k-token request arrives meanwhile: the pool (1.5x the prefix) cannot
    hold both, so `s` is evicted (demoted). With prefetch its context is loaded back
    `prefetch_lead_s` before the expected return and the next step hits the pool; without it,
    the next step loads it from the store when it starts. Both engines share one tier
    directory (each loads what the other computed, so the warm-up prefills twice, not four
    times); rounds alternate on/off; medians reported."""
    wait_s = 6.0  # the other request (a ~2k load, ~1-4 s here) ends well before the prefetch is due
    ids, other = _prompt(engine, tokens), _other_prompt(engine, tokens)
    result = engine.tokenize("\nTool result: 42 rows matched; the first is 'alpha'.\n")
    engines = _prefetch_engines(engine, tier_dir, tokens)
    rows: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    try:
        ctx = _prefetch_warm_up(engines, ids, other)
        step = ctx + result
        for _ in range(repeats):
            for mode, eng in engines.items():
                row = _prefetch_round(eng, ctx, step, other, wait_s)
                rows[mode].append(row)
                say(f"prefetch {mode}: next-step TTFT {row['ttft_s']:.3f}s {row}")
    finally:
        for eng in engines.values():
            eng.shutdown()
    med = {m: statistics.median(r["ttft_s"] for r in v) for m, v in rows.items()}
    return {
        "tool_wait_s": wait_s,
        "prefix_tokens": len(ctx),
        "step_tokens": len(step),
        "pool_tokens": int(1.5 * tokens) + 64,
        "on": {"ttft_s": med["on"], "rounds": rows["on"], "details": rows["on"][-1]["details"]},
        "off": {"ttft_s": med["off"], "rounds": rows["off"], "details": rows["off"][-1]["details"]},
        "speedup_on_vs_off": med["off"] / med["on"],
    }


def writer_section(engine: Any, tier_dir: Path, tokens: int, repeats: int, say: Callable) -> dict:
    """Seconds the engine thread spends evicting a ~2k-token prefix (demotion included), with
    synchronous writes vs the background writer; then the writer's drain time and a reload
    (outputs compared). A fresh salt per round: every eviction writes new pages."""
    ids = _prompt(engine, tokens)
    modes = {"synchronous": 0, "background writer": 128}
    engines = {
        mode: engine.sibling(
            enable_hierarchical_cache=True,
            hicache_storage_dir=str(tier_dir / f"writer-{mb}"),
            hicache_write_queue_mb=mb,
            max_total_tokens=2 * tokens,
        )
        for mode, mb in modes.items()
    }
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    same = []
    try:
        for r in range(repeats):
            for mode, eng in engines.items():
                salt = f"{mode}-{r}"
                first = eng.generate(input_ids=ids, sampling_params=GREEDY, cache_salt=salt)
                with eng.scheduler.lock:
                    began = time.perf_counter()
                    eng.cache.evict(eng.cache.evictable_size)
                    stall = time.perf_counter() - began
                began = time.perf_counter()
                eng.tier.tier.flush(120)
                drain = time.perf_counter() - began
                t, again = _ttft(eng, ids, cache_salt=salt)
                same.append(again["output_ids"] == first["output_ids"])
                rows[mode].append({"stall_s": stall, "drain_s": drain, "reload_ttft_s": t})
                say(f"writer {mode}: eviction stall {stall:.3f}s, drain {drain:.3f}s, reload {t:.3f}s")
        stats = {m: e.get_cache_stats()["tier"] for m, e in engines.items()}
    finally:
        for eng in engines.values():
            eng.shutdown()
    med = statistics.median
    out: dict[str, Any] = {"prefix_tokens": len(ids), "outputs_identical": all(same)}
    for mode, rs in rows.items():
        out[mode] = {
            "stall_s": med(x["stall_s"] for x in rs),
            "drain_s": med(x["drain_s"] for x in rs),
            "reload_ttft_s": med(x["reload_ttft_s"] for x in rs),
            "rounds": rs,
            "writer": stats[mode].get("writer"),
        }
    out["stall_ratio"] = out["synchronous"]["stall_s"] / max(1e-9, out["background writer"]["stall_s"])
    return out


@contextmanager
def redis_server(workdir: Path) -> Iterator[str | None]:
    """A private redis-server on loopback, or None when it is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--maxmemory",
        "2gb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _flush_redis(url: str) -> None:
    """Each mode starts from an empty shared tier."""
    import redis

    redis.Redis.from_url(url).flushall()


def cluster_section(engine: Any, tier_dir: Path, sessions: int, steps: int, say: Callable) -> dict:
    doc = _prompt(engine, 256)
    out: dict[str, Any] = {"sessions": sessions, "steps": steps, "routing": "every step on the other worker"}
    with redis_server(tier_dir) as url:
        if url is None:
            return out | {"skipped": "redis-server not installed (apt-get install -y redis-server)"}
        modes = (
            "no tier",
            "shared redis tier",
            "shared redis tier, synchronous writes",
            "one worker, no switch (reference)",
        )
        for mode in modes:
            kw: dict[str, Any] = {"max_total_tokens": 4096}
            if mode.startswith("shared"):
                _flush_redis(url)
                kw |= {
                    "enable_hierarchical_cache": True,
                    "hicache_storage_backend": "redis",
                    "hicache_storage_url": url,
                    "hicache_write_queue_mb": 0 if "synchronous" in mode else 128,
                    "hicache_mac_key": "bench-tier-shared-key-0123456789",  # both workers read it
                }
            workers = [engine.sibling(**kw), engine.sibling(**kw)]
            prompt = cached = 0
            try:
                for s in range(sessions):
                    ctx = engine.tokenize(f"Session {s}.\n") + doc
                    for step in range(steps):
                        ctx = ctx + engine.tokenize(f"\nStep {step}: observation {s * 31 + step}.")
                        worker = workers[0 if mode.startswith("one") else (s + step) % 2]
                        r = worker.generate(input_ids=ctx, sampling_params=GREEDY, session_id=f"s{s}")
                        prompt += len(ctx)
                        cached += r["meta_info"]["cached_tokens"]
                        ctx = ctx + r["output_ids"]
                if mode == "shared redis tier":
                    out["redis_footprint"] = workers[0].tier.tier.store.footprint()
            finally:
                for w in workers:
                    w.shutdown()
            out[mode] = {"prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt}
            say(f"cluster {mode}: hit rate {cached / prompt:.3f}")
    return out


def _procs_worker_args(mode: str, url: str) -> tuple[str, ...]:
    """`radixagent serve` flags of each worker in `mode`."""
    args: tuple[str, ...] = ("--max-total-tokens", "4096")
    if mode == "shared redis tier":
        args += (
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "redis",
            "--hicache-storage-url",
            url,
        )
    return args


def _procs_session(
    client: Any, cluster_url: str, engine: Any, doc: list[int], s: int, steps: int
) -> tuple[int, int, int]:
    """Session `s`'s steps through the router: (prompt tokens, cached tokens, worker switches)."""
    prompt = cached = switches = 0
    ctx = engine.tokenize(f"Session {s}.\n") + doc
    last = None
    for step in range(steps):
        ctx = ctx + engine.tokenize(f"\nStep {step}: observation {s * 31 + step}.")
        body = {"input_ids": ctx, "sampling_params": GREEDY, "session_id": f"s{s}"}
        resp = client.post(cluster_url + "/generate", json=body)
        resp.raise_for_status()
        r = resp.json()
        r = r[0] if isinstance(r, list) else r
        worker = r["meta_info"].get("worker_id")
        switches += last is not None and worker != last
        last = worker
        prompt += len(ctx)
        cached += r["meta_info"]["cached_tokens"]
        ctx = ctx + r["output_ids"]
    return prompt, cached, switches


def _procs_mode(
    engine: Any, tier_dir: Path, mode: str, url: str, doc: list[int], sessions: int, steps: int
) -> dict[str, Any]:
    """Every session through a fresh 2-worker cluster in `mode`: its row."""
    import httpx

    from runtime.cluster.cluster import Cluster, ClusterConfig

    cfg = ClusterConfig(
        workers=2,
        policy="round_robin",
        worker_args=_procs_worker_args(mode, url),
        log_dir=str(tier_dir / f"cluster-{mode.replace(' ', '-')}"),
    )
    prompt = cached = switches = 0
    with Cluster(cfg) as cluster, httpx.Client(timeout=600) as client:
        for s in range(sessions):
            p, c, w = _procs_session(client, cluster.url, engine, doc, s, steps)
            prompt, cached, switches = prompt + p, cached + c, switches + w
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt,
        "worker_switches": switches,
        "requests": sessions * steps,
    }


def _redis_footprint(url: str) -> dict[str, Any]:
    """Entries and memory of the shared redis-server (a report figure only: errors are reported)."""
    try:
        import redis

        client_r = redis.Redis.from_url(url)
        return {
            "entries": sum(1 for _ in client_r.scan_iter(match="radixagent:kv:*", count=1000)),
            "used_memory": int(client_r.info("memory")["used_memory"]),
        }
    except Exception as exc:  # a report figure only
        return {"error": str(exc)}


def cluster_procs_section(engine: Any, tier_dir: Path, sessions: int, steps: int, say: Callable) -> dict:
    """2 `radixagent serve` processes behind the router (`round_robin`: one request at a time,
    so session s's step k lands on worker k % 2, every step on the other worker), without a
    tier vs sharing one redis-server. Prompts are token ids (the workers' tokenizer)."""
    from runtime.cluster.cluster import router_available

    doc = _prompt(engine, 256)
    out: dict[str, Any] = {
        "sessions": sessions,
        "steps": steps,
        "routing": "router round_robin, one request at a time: each step on the other worker",
    }
    if not router_available("auto"):
        return out | {"skipped": "no router installed (pip install smg==1.13.0 or sglang-router==0.3.2)"}
    with redis_server(tier_dir) as url:
        if url is None:
            return out | {"skipped": "redis-server not installed (apt-get install -y redis-server)"}
        for mode in ("no tier", "shared redis tier"):
            say(f"cluster-procs {mode}: starting 2 workers ...")
            row = out[mode] = _procs_mode(engine, tier_dir, mode, url, doc, sessions, steps)
            say(
                f"cluster-procs {mode}: hit rate {row['hit_rate']:.3f}, "
                f"{row['worker_switches']} worker switches"
            )
        out["redis_footprint"] = _redis_footprint(url)
    return out


def real_section(engine: Any, tier_dir: Path, sessions: int, budget: float, say: Callable) -> dict:
    """evals/eviction/real.py's `agents` script replayed on the real engine with a tight pool,
    per policy with the tier off and on (file backend, a fresh directory per run)."""
    from evals.eviction.real import RealConfig, peak_working_set, plan, pool_tokens, replay, summarize

    cfg = RealConfig(sessions=sessions, budget_fraction=budget, policies=("lru", "session"))
    scripts, order = plan(cfg, engine.tokenize)
    peak, biggest = peak_working_set(cfg, scripts, order)
    pool, floored = pool_tokens(cfg, peak, biggest)
    rows = []
    for policy in cfg.policies:
        for tier in ("off", "on"):
            kw: dict[str, Any] = {"radix_eviction_policy": policy, "max_total_tokens": pool}
            if tier == "on":
                kw |= {
                    "enable_hierarchical_cache": True,
                    "hicache_storage_dir": str(tier_dir / f"real-{policy}"),
                }
            eng = engine.sibling(**kw)
            try:
                began = time.perf_counter()
                records = replay(eng, cfg, scripts, order)
                eng.check_integrity()
                stats = eng.get_cache_stats()
                row = summarize(policy, records, stats, time.perf_counter() - began)
            finally:
                eng.shutdown()
            row |= {"tier": tier, "tier_loaded_tokens": stats.get("tier_loaded_tokens", 0)}
            rows.append(row)
            say(
                f"real {policy} tier {tier}: recomputed {row['recomputed_tokens']}, hit {row['hit_rate']:.3f}, "
                f"loaded {row['tier_loaded_tokens']}, ttft p50 {row['ttft_p50_s']:.3f}s"
            )
    return {
        "sessions": sessions,
        "budget_fraction": budget,
        "requests": len(order),
        "peak_working_set": peak,
        "pool_tokens": pool,
        "pool_floored": floored,
        "rows": rows,
    }


def eviction_section(say: Callable) -> dict:
    from evals.eviction.tier_sim import tier_grid

    rows = tier_grid()
    for frac in sorted({r["budget_fraction"] for r in rows}):
        sel = [r for r in rows if r["budget_fraction"] == frac]
        off = next(r for r in sel if r["policy"] == "lru" and r["tier"] == "off")["recomputed_tokens"]
        for r in sel:
            r["recomputed_vs_lru_off"] = r["recomputed_tokens"] / off if off else None
        say(
            f"eviction budget {frac}: lru off {off}, "
            + ", ".join(f"{r['policy']}/{r['tier']} {r['recomputed_tokens']}" for r in sel)
        )
    return {"model": "simulator (evals/eviction/tier_sim.py), 64 real tokens per page", "rows": rows}


def _join_ttfts(rounds: list[dict]) -> str:
    return ", ".join(f"{r['ttft_s']:.3f}" for r in rounds)


def _reload_lines(rl: dict) -> list[str]:
    """Reload vs recompute: the TTFT table, the per-hit figures, the write policies' table."""
    return [
        f"## Reload vs recompute ({rl['prompt_tokens']}-token prompt, {rl['loaded_tokens']} loaded)",
        "",
        "| path | TTFT (s) |",
        "|---|---|",
        f"| recompute (cold) | {rl['ttft_cold_s']:.3f} |",
        f"| load from file tier | {rl['ttft_tier_s']:.3f} |",
        f"| pool hit | {rl['ttft_pool_s']:.3f} |",
        "",
        f"Tier vs recompute: **{rl['speedup_tier_vs_cold']:.1f}x**; outputs identical: {rl['outputs_identical']}. "
        f"Load {rl['tier_load_time_s_per_hit'] * 1000:.0f} ms per hit; write "
        f"{rl['tier_write_time_s_per_page'] * 1000:.1f} ms per 64-token page. "
        f"Disk {rl['disk_bytes_per_token']:.0f} B/token vs pool {rl['pool_bytes_per_token']} B/token.",
        "",
        "| write policy | first-request TTFT (s) | write time (s) |",
        "|---|---|---|",
        *[
            f"| {k} | {v['ttft_first_s']:.3f} | {v['write_time_s']:.3f} |"
            for k, v in rl["write_policy"].items()
        ],
        "",
    ]


def _writer_lines(wr: dict) -> list[str]:
    """The eviction stall with synchronous writes vs the background writer."""
    return [
        f"## Eviction stall: demoting a {wr['prefix_tokens']}-token prefix on the engine thread",
        "",
        "| writes | eviction stall (s) | writer drain after it (s) | reload TTFT (s) |",
        "|---|---|---|---|",
        *[
            f"| {m} | {wr[m]['stall_s']:.3f} | {wr[m]['drain_s']:.3f} | {wr[m]['reload_ttft_s']:.3f} |"
            for m in ("synchronous", "background writer")
        ],
        "",
        f"Stall {wr['stall_ratio']:.1f}x shorter with the writer; outputs identical after reload: "
        f"{wr['outputs_identical']}. Writer: {wr['background writer']['writer']}.",
        "",
    ]


def _prefetch_row(pf: dict, m: str) -> str:
    """The prefetch table's row of mode `m` (on, off)."""
    return (
        f"| {m} | {pf[m]['ttft_s']:.3f} | {_join_ttfts(pf[m]['rounds'])} | "
        f"{', '.join(str(r['resident_before_resume']) for r in pf[m]['rounds'])} | "
        f"{pf[m]['rounds'][-1]['computed_tokens']} | "
        f"{pf[m]['details']} |"
    )


def _prefetch_lines(pf: dict) -> list[str]:
    """Prefetch on vs off: the setting, the table, when the prefetch landed."""
    return [
        "## Prefetch: a session's prefix evicted by another tenant while its tool runs",
        "",
        f"Context {pf['prefix_tokens']} tokens, next step {pf['step_tokens']} tokens, pool "
        f"{pf['pool_tokens']} tokens, tool wait {pf['tool_wait_s']} s (prefetch due 0.5 s + 2x the "
        "estimated load time before the expected return; retried while the pool has no room).",
        "",
        "| prefetch | TTFT of the step after the tool (s), median | per round | resident before resume | "
        "computed tokens | served from |",
        "|---|---|---|---|---|---|",
        *[_prefetch_row(pf, m) for m in ("on", "off")],
        "",
        f"Prefetch on vs off: **{pf['speedup_on_vs_off']:.2f}x**. The prefetch landed "
        f"{[r['prefetch_landed_s'] for r in pf['on']['rounds']]} s after the tool wait began "
        "(None: not seen by the 50 ms poll, which stops at the expected return); the other tenant's "
        f"request took {[round(r['other_request_s'], 1) for r in pf['on']['rounds']]} s.",
        "",
    ]


def _cluster_lines(cl: dict) -> list[str]:
    """In-process workers: hit rate per mode."""
    return [
        f"## Cluster: 2 workers, {cl['sessions']} sessions x {cl['steps']} steps, {cl['routing']}",
        "",
        "| mode | hit rate |",
        "|---|---|",
        *[
            f"| {m} | {cl[m]['hit_rate']:.3f} |"
            for m in cl
            if isinstance(cl[m], dict) and "hit_rate" in cl[m]
        ],
        "",
        f"Redis footprint: {cl.get('redis_footprint')}",
        "",
    ]


def _cluster_procs_lines(cp: dict) -> list[str]:
    """`radixagent cluster` processes: hit rate and worker switches per mode, or why skipped."""
    lines = [f"## Cluster through `radixagent cluster` processes: 2 workers, {cp['routing']}", ""]
    if "skipped" in cp:
        return lines + [f"Skipped: {cp['skipped']}", ""]
    return lines + [
        f"{cp['sessions']} sessions x {cp['steps']} steps.",
        "",
        "| mode | hit rate | worker switches / requests |",
        "|---|---|---|",
        *[
            f"| {m} | {cp[m]['hit_rate']:.3f} | {cp[m]['worker_switches']} / {cp[m]['requests']} |"
            for m in ("no tier", "shared redis tier")
        ],
        "",
        f"Redis footprint: {cp.get('redis_footprint')}",
        "",
    ]


def _real_lines(rr: dict) -> list[str]:
    """The real engine's agents workload: a row per policy and tier."""
    return [
        f"## Real engine: agents workload, {rr['sessions']} sessions, {rr['requests']} requests, "
        f"pool {rr['pool_tokens']} tokens ({rr['budget_fraction']} of the peak working set "
        f"{rr['peak_working_set']}{'; floored at the largest request' if rr['pool_floored'] else ''})",
        "",
        "| policy | tier | recomputed tokens | hit rate | loaded from tier | TTFT p50 (s) |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['policy']} | {r['tier']} | {r['recomputed_tokens']} | {r['hit_rate']:.3f} | "
            f"{r['tier_loaded_tokens']} | {r['ttft_p50_s']:.3f} |"
            for r in rr["rows"]
        ],
        "",
    ]


def _eviction_lines(ev: dict) -> list[str]:
    """The simulator's agents workload: a row per budget, policy and tier."""
    return [
        "## Eviction: agents workload, 64 sessions (" + ev["model"] + ")",
        "",
        "| budget | policy | tier | recomputed tokens | vs lru without tier | loaded from tier |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['budget_fraction']} | {r['policy']} | {r['tier']} | {r['recomputed_tokens']} | "
            f"{r['recomputed_vs_lru_off']:.3f} | {r['tier_loaded_tokens']} |"
            for r in ev["rows"]
        ],
        "",
    ]


def render(res: dict) -> str:
    """docs/results/bench-tier.md: a section per measured part of `res`, in a fixed order."""
    rl, wr, pf = res.get("reload", {}), res.get("writer", {}), res.get("prefetch", {})
    cl, cp, rr = res.get("cluster", {}), res.get("cluster-procs", {}), res.get("real", {})
    lines = [
        "# KV tier benchmarks",
        "",
        "Generated by `python -m evals.benchmarks.bench_tier`; ratios within one run. `--only` re-measures some "
        "sections and keeps the others from earlier runs: docs/tier.md says which run and machine load "
        "each figure comes from.",
        "",
    ]
    if rl:
        lines += _reload_lines(rl)
    if wr:
        lines += _writer_lines(wr)
    if pf and "rounds" in pf.get("on", {}):
        lines += _prefetch_lines(pf)
    if cl and "skipped" not in cl:
        lines += _cluster_lines(cl)
    if cp:
        lines += _cluster_procs_lines(cp)
    if rr:
        lines += _real_lines(rr)
    if "eviction" in res:
        lines += _eviction_lines(res["eviction"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("docs/results/bench-tier.md"))
    p.add_argument(
        "--tokens", type=int, default=2048, help="prefix length of the reload and prefetch sections"
    )
    p.add_argument("--repeats", type=int, default=2)
    sections = ("reload", "writer", "prefetch", "cluster", "cluster-procs", "real", "eviction")
    p.add_argument("--only", choices=sections, action="append")
    p.add_argument("--real-sessions", type=int, default=8, help="sessions of the real-engine section")
    p.add_argument("--real-budget", type=float, default=0.25, help="its pool, a fraction of the peak")
    args = p.parse_args(argv)
    only = set(args.only or sections)
    say = lambda msg: print(f"[bench-tier {time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    json_path = args.out.with_suffix(".json")
    # --only re-measures some sections and keeps the others from the last run
    res: dict[str, Any] = json.loads(json_path.read_text()) if args.only and json_path.exists() else {}
    if "eviction" in only:
        res["eviction"] = eviction_section(say)
    if only - {"eviction"}:
        from runtime import Engine
        from runtime.env import offline_hub

        offline_hub()
        engine = Engine(max_total_tokens=1024)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                if "reload" in only:
                    res["reload"] = reload_section(engine, Path(tmp), args.tokens, args.repeats, say)
                if "prefetch" in only:
                    res["prefetch"] = prefetch_section(
                        engine, Path(tmp), args.tokens, 2 * args.repeats + 1, say
                    )
                if "writer" in only:
                    res["writer"] = writer_section(engine, Path(tmp), args.tokens, args.repeats, say)
                if "cluster" in only:
                    res["cluster"] = cluster_section(engine, Path(tmp), 4, 4, say)
                if "cluster-procs" in only:
                    res["cluster-procs"] = cluster_procs_section(engine, Path(tmp), 4, 4, say)
                if "real" in only:
                    res["real"] = real_section(engine, Path(tmp), args.real_sessions, args.real_budget, say)
            finally:
                engine.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(res, indent=1, default=str))
    args.out.write_text(render(res))
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
