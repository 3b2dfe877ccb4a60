"""Runs the workload x sessions x budget x policy grid and averages over seeds."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evals.eviction import workloads
from evals.eviction.simulator import POLICIES, Replay, budget_for
from evals.eviction.workloads import BLOCK

BUDGET_DEFINITION = (
    "The KV pool size, as a fraction of the peak working set: the most distinct tokens ever on the "
    "live (non-abandoned) contexts of all open sessions, measured in a replay with an infinite cache. "
    "The pool holds both the cached tree and the KV of requests in flight (their uncached prompt "
    "suffix and their output), so a request waits when in-flight KV alone fills it. Budgets are "
    "floored at the largest single request so that every request can run. "
    f"Tokens are simulated in blocks of {BLOCK} real tokens; all counts are reported in real tokens."
)


@dataclass(frozen=True, slots=True)
class GridConfig:
    workloads: tuple[str, ...] = workloads.WORKLOADS
    sessions: tuple[int, ...] = (8, 32, 64, 256, 1000)
    budgets: tuple[float, ...] = (0.10, 0.25, 0.50, 1.00)
    policies: tuple[str, ...] = POLICIES
    seeds: int = 1
    steps: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for w in self.workloads:
            if w not in workloads.WORKLOADS:
                raise ValueError(f"unknown workload {w!r}; choose from {list(workloads.WORKLOADS)}")
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"unknown policy {p!r}; choose from {list(POLICIES)}")
        if any(not 0 < b <= 1 for b in self.budgets) or any(n <= 0 for n in self.sessions) or self.seeds < 1:
            raise ValueError("budgets must be in (0, 1], sessions and seeds positive")

    def cells(self) -> list[tuple[str, int]]:
        return [(w, n) for w in self.workloads for n in self.sessions]


def run_cell(cfg: GridConfig, workload: str, n: int, tick: Callable[[], None]) -> list[dict]:
    """All budgets x policies of one workload and session count, averaged over seeds."""
    acc: dict[tuple[float, str], list[dict]] = {}
    for seed in range(cfg.seeds):
        w = workloads.make(workload, n, seed, cfg.steps)
        peak = Replay(w, "lru", None).run().peak_working_set
        for frac in cfg.budgets:
            budget = budget_for(w, frac, peak)
            for policy in cfg.policies:
                st = Replay(w, policy, budget).run()
                per = st.per_session_recompute
                acc.setdefault((frac, policy), []).append(
                    {
                        "prompt_tokens": st.prompt_tokens * BLOCK,
                        "cached_tokens": st.cached_tokens * BLOCK,
                        "recomputed_tokens": st.recomputed_tokens * BLOCK,
                        "seconds": st.seconds,
                        "requests": st.requests,
                        "budget_tokens": budget * BLOCK,
                        "peak_working_set_tokens": peak * BLOCK,
                        "evicted_tokens": st.evicted_tokens * BLOCK,
                        "queue_wait_mean_s": st.queue_wait_s / max(1, st.requests),
                        "recomputed_per_session_mean": statistics.fmean(per) * BLOCK,
                        "recomputed_per_session_p95": _p95(per) * BLOCK,
                        "recomputed_per_session_max": max(per) * BLOCK,
                    }
                )
                tick()
    rows = []
    for (frac, policy), runs in acc.items():
        row: dict[str, Any] = {"workload": workload, "sessions": n, "budget_fraction": frac, "policy": policy}
        for key in runs[0]:
            row[key] = statistics.fmean(r[key] for r in runs)
        row["hit_rate"] = row["cached_tokens"] / row["prompt_tokens"] if row["prompt_tokens"] else 0.0
        row["seeds"] = len(runs)
        rows.append(row)
    return rows


def _p95(xs: Sequence[int]) -> float:
    ordered = sorted(xs)
    return float(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))])


def run_grid(cfg: GridConfig, tick: Callable[[], None] = lambda: None) -> dict:
    rows = [row for w, n in cfg.cells() for row in run_cell(cfg, w, n, tick)]
    return {"budget_definition": BUDGET_DEFINITION, "block_tokens": BLOCK, "seeds": cfg.seeds, "rows": rows}


def total_runs(cfg: GridConfig) -> int:
    return len(cfg.cells()) * cfg.seeds * len(cfg.budgets) * len(cfg.policies)
