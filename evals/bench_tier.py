"""KV tier benchmarks (issue #24): `python -m evals.bench_tier [--out docs/bench_tier.md]`.

Sections, all in one process and run (ratios compare numbers taken minutes apart on a shared
CPU: read them as ratios, not absolute times):
- reload: a ~2k-token prefix recomputed (cold) vs loaded from the file tier (after eviction)
  vs served from the pool; greedy outputs compared; write_back vs write_through cost.
- prefetch: a session's prefix evicted while it waits on a tool: TTFT of the next step with
  the prefetch on vs off.
- cluster: two in-process workers (sibling engines over one set of weights), every session
  step routed to the other worker: hit rate with a shared Redis tier vs without any tier.
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
    from evals.bench import essay_documents

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


def prefetch_section(engine: Any, tier_dir: Path, tokens: int, repeats: int, say: Callable) -> dict:
    """Both engines share one tier directory (the second loads the prefix the first computed);
    rounds alternate on/off so load drifts hit both alike; medians reported."""
    ids = _prompt(engine, tokens)
    engines = {
        mode: engine.sibling(
            enable_hierarchical_cache=True,
            hicache_storage_dir=str(tier_dir / "prefetch"),
            hicache_prefetch=mode == "on",
            radix_eviction_policy="session",
            max_total_tokens=4 * tokens,
        )
        for mode in ("on", "off")
    }
    times: dict[str, list[float]] = {"on": [], "off": []}
    details: dict[str, Any] = {}
    try:
        for eng in engines.values():
            first = eng.generate(input_ids=ids, sampling_params=GREEDY, session_id="s")
            _evict_all(eng)
        step = ids + first["output_ids"] + engine.tokenize(" ok")
        for _ in range(repeats):
            for mode, eng in engines.items():
                _evict_all(eng)  # another tenant's burst pushed it out while the tool runs
                eng.session_event("s", "tool_wait", expected_s=1.0)
                time.sleep(1.2)
                eng.session_event("s", "resume")
                t, r = _ttft(eng, step, session_id="s")
                times[mode].append(t)
                details[mode] = r["meta_info"]["cached_tokens_details"]
                say(f"prefetch {mode}: next-step TTFT {t:.3f}s {details[mode]}")
    finally:
        for eng in engines.values():
            eng.shutdown()
    med = {m: statistics.median(v) for m, v in times.items()}
    return {
        "on": {"ttft_s": med["on"], "samples": times["on"], "details": details["on"]},
        "off": {"ttft_s": med["off"], "samples": times["off"], "details": details["off"]},
        "speedup_on_vs_off": med["off"] / med["on"],
    }


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


def cluster_section(engine: Any, tier_dir: Path, sessions: int, steps: int, say: Callable) -> dict:
    doc = _prompt(engine, 256)
    out: dict[str, Any] = {"sessions": sessions, "steps": steps, "routing": "every step on the other worker"}
    with redis_server(tier_dir) as url:
        if url is None:
            return out | {"skipped": "redis-server not installed (apt-get install -y redis-server)"}
        for mode in ("no tier", "shared redis tier", "one worker, no switch (reference)"):
            kw = {"max_total_tokens": 4096}
            if mode == "shared redis tier":
                kw |= {
                    "enable_hierarchical_cache": True,
                    "hicache_storage_backend": "redis",
                    "hicache_storage_url": url,
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


def render(res: dict) -> str:
    rl, pf, cl = res.get("reload", {}), res.get("prefetch", {}), res.get("cluster", {})
    lines = [
        "# KV tier benchmarks",
        "",
        "Generated by `python -m evals.bench_tier`; ratios within one run.",
        "",
    ]
    if rl:
        lines += [
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
    if pf:
        lines += [
            "## Prefetch (next step after a tool wait, prefix evicted meanwhile)",
            "",
            f"TTFT with prefetch {pf['on']['ttft_s']:.3f} s vs without {pf['off']['ttft_s']:.3f} s "
            f"({pf['speedup_on_vs_off']:.2f}x); served from: on {pf['on']['details']}, off {pf['off']['details']}.",
            "",
        ]
    if cl and "skipped" not in cl:
        lines += [
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
    if "eviction" in res:
        lines += [
            "## Eviction: agents workload, 64 sessions (" + res["eviction"]["model"] + ")",
            "",
            "| budget | policy | tier | recomputed tokens | vs lru without tier | loaded from tier |",
            "|---|---|---|---|---|---|",
            *[
                f"| {r['budget_fraction']} | {r['policy']} | {r['tier']} | {r['recomputed_tokens']} | "
                f"{r['recomputed_vs_lru_off']:.3f} | {r['tier_loaded_tokens']} |"
                for r in res["eviction"]["rows"]
            ],
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("docs/bench_tier.md"))
    p.add_argument(
        "--tokens", type=int, default=2048, help="prefix length of the reload and prefetch sections"
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", choices=("reload", "prefetch", "cluster", "eviction"), action="append")
    args = p.parse_args(argv)
    only = set(args.only or ("reload", "prefetch", "cluster", "eviction"))
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
                if "cluster" in only:
                    res["cluster"] = cluster_section(engine, Path(tmp), 4, 4, say)
            finally:
                engine.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(res, indent=1, default=str))
    args.out.write_text(render(res))
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
