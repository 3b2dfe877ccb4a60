"""The trace replay grid (modes x capacities x policies) and its rows in the eviction results schema."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evals.eviction.mooncake import BLOCK_TOKENS, Trace, infinite_reuse
from evals.eviction.trace_replay import MODES, POLICIES, CostModel, ReplayResult, replay

TRACE_DEFINITION = (
    "Trace replays (`--trace FILE --trace-format mooncake`): the engine's RadixCache, SlotAllocator and "
    f"eviction policies over 512-token blocks (one tree key unit = one block of {BLOCK_TOKENS} tokens), "
    "capacity in blocks (null = infinite). mode 'hitrate': in timestamp order, each request matched then "
    "inserted (Mooncake Table 1). mode 'timed': requests arrive at their timestamps and lock their "
    "matched prefix and hold KV for their uncached prompt and output for prefill_s_per_token x uncached "
    "prompt tokens + decode_s_per_token x output tokens; a request that cannot get its KV waits (FIFO). "
    "block_hit_rate = cached / prompt blocks; hit_rate = cached / prompt tokens (a matched partial last "
    "block counts its tokens); recomputed_tokens = prompt tokens an earlier finished request had computed "
    "but the cache no longer held; headroom_captured = (LRU's recomputed - policy's) / (LRU's - "
    "oracle's), null where the oracle saves under 0.1% of LRU's recomputed tokens."
)


@dataclass(frozen=True, slots=True)
class TraceGrid:
    modes: tuple[str, ...] = MODES
    capacities: tuple[int | None, ...] = (1000, 10000, 30000, None)
    policies: tuple[str, ...] = POLICIES
    cost: CostModel = CostModel()

    def __post_init__(self) -> None:
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r}; choose from {list(MODES)}")
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"unknown policy {p!r}; choose from {list(POLICIES)}")
        for c in self.capacities:
            if c is not None and c <= 0:
                raise ValueError(f"--capacities: {c} is not a positive number of blocks")
        if not (self.modes and self.capacities and self.policies):
            raise ValueError("modes, capacities and policies must each name at least one")

    def check(self, trace: Trace) -> None:
        """Fail before any replay if a timed capacity cannot hold the largest request."""
        if "timed" not in self.modes:
            return
        biggest = max(r.footprint_blocks for r in trace.requests)
        small = [c for c in self.capacities if c is not None and c < biggest]
        if small:
            raise ValueError(
                f"--capacities {small[0]} is below the largest request of {trace.workload} "
                f"({biggest} blocks of prompt + output): the timed replay could never run it"
            )

    def runs(self) -> list[tuple[str, int | None, str]]:
        """(mode, capacity, policy); infinite capacity once per mode (no eviction: policy-free)."""
        out: list[tuple[str, int | None, str]] = []
        for mode in self.modes:
            for cap in self.capacities:
                out += [(mode, cap, "lru")] if cap is None else [(mode, cap, p) for p in self.policies]
        return out


def row_of(trace: Trace, r: ReplayResult, policy: str, cost: CostModel) -> dict:
    row = {
        "workload": trace.workload,
        "mode": r.mode,
        "capacity_blocks": r.capacity_blocks,
        "policy": policy,
        "block_hit_rate": r.block_hit_rate,
        "hit_rate": r.hit_rate,
        "recomputed_tokens": r.recomputed_tokens,
        "seconds": r.seconds,
        "cpu_seconds": r.cpu_seconds,
        "requests": r.requests,
        "prompt_blocks": r.prompt_blocks,
        "cached_blocks": r.cached_blocks,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "evicted_blocks": r.evicted_blocks,
        "block_tokens": BLOCK_TOKENS,
        "policy_free": r.capacity_blocks is None,
    }
    if r.mode == "timed":
        row |= {
            "queue_wait_mean_s": r.queue_wait_s / max(1, r.requests),
            "makespan_s": r.makespan_s,
            "prefill_s_per_token": cost.prefill_s_per_token,
            "decode_s_per_token": cost.decode_s_per_token,
        }
    return row


#: below this share of LRU's recomputed tokens the oracle has no headroom worth dividing by
MIN_HEADROOM = 0.001


def add_headroom(rows: list[dict]) -> None:
    """Each row's share of the oracle's headroom over LRU (recomputed tokens), where both exist
    and the headroom is real: a ratio of two near-ties would read as a large share."""
    by = {(r["workload"], r["mode"], r["capacity_blocks"], r["policy"]): r for r in rows}
    for r in rows:
        key = (r["workload"], r["mode"], r["capacity_blocks"])
        lru, oracle = by.get((*key, "lru")), by.get((*key, "oracle"))
        head = lru["recomputed_tokens"] - oracle["recomputed_tokens"] if lru and oracle else 0
        real = lru is not None and head > 0 and head >= MIN_HEADROOM * lru["recomputed_tokens"]
        r["headroom_captured"] = (
            (lru["recomputed_tokens"] - r["recomputed_tokens"]) / head if real and lru is not None else None
        )


def run_trace_grid(
    trace: Trace,
    grid: TraceGrid,
    tick: Callable[[int], None] = lambda n: None,
    started: Callable[[str], None] = lambda s: None,
) -> list[dict]:
    grid.check(trace)
    rows = []
    for mode, cap, policy in grid.runs():
        started(f"{trace.workload} {mode} {'inf' if cap is None else cap} {policy if cap else 'policy-free'}")
        r = replay(trace, mode, policy, cap, grid.cost, tick)
        names = grid.policies if cap is None else (policy,)
        rows += [row_of(trace, r, p, grid.cost) for p in names]
    add_headroom(rows)
    return rows


def trace_summary(trace: Trace) -> dict:
    reuse = infinite_reuse(trace)
    return {
        "workload": trace.workload,
        "requests": len(trace.requests),
        "block_lookups": trace.block_lookups,
        "distinct_blocks": trace.distinct_blocks,
        "infinite_block_hit_rate": reuse.block_hit_rate,
        "infinite_hit_rate": reuse.hit_rate,
        "prompt_tokens": reuse.prompt_tokens,
    }


def _key(row: dict) -> tuple:
    return (
        row.get("workload"),
        row.get("mode"),
        row.get("capacity_blocks"),
        row.get("policy"),
        row.get("prefill_s_per_token"),
        row.get("decode_s_per_token"),
        row.get("sessions"),
        row.get("budget_fraction"),
    )


def merge_results(path: Path, rows: Sequence[dict], summaries: Sequence[dict]) -> dict:
    """Append rows to `results.json` (a row with the same workload/mode/capacity/policy/cost model is replaced);
    simulated-workload rows already there stay."""
    results: dict = {}
    if path.exists():
        try:
            results = json.loads(path.read_text())
        except json.JSONDecodeError:
            results = {}
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        results = {}
    new = {_key(r) for r in rows}
    kept = [r for r in results.get("rows", []) if _key(r) not in new]
    results.setdefault("budget_definition", TRACE_DEFINITION)
    results["trace_replay_definition"] = TRACE_DEFINITION
    traces = {t["workload"]: t for t in results.get("traces", [])}
    traces.update({t["workload"]: t for t in summaries})
    results["traces"] = list(traces.values())
    results["rows"] = kept + list(rows)
    path.write_text(json.dumps(results, indent=1))
    return results
