"""Pure functions from recorded calls to the DESIGN.md "Eval results" numbers, and regression checks.

Per suite and mode: `requests`, `prompt_tokens`, `cached_tokens`, `hit_rate`, `prefill_tokens_computed`,
`ttft_p50_s`, `ttft_p95_s`, `e2e_s`, `outputs_identical`, `accuracy` (+ a few extensions). Per suite:
`speedup_ttft_p50`, `speedup_e2e`. Nothing here touches a backend, so unit tests feed synthetic records.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from evals.suites.recording import CallRecord
from tasks.output import percentile

#: What the issue asks of each suite on the default model (speedup = uncached / cached).
TARGETS: dict[str, dict[str, float]] = {
    "longdoc": {"speedup_ttft_p50": 10.0, "speedup_e2e": 2.0},
    "reasoning": {"speedup_e2e": 1.5},
    "chat": {"speedup_e2e": 0.95},  # cached not slower than uncached by more than 5 %
}
IDENTICAL_TARGET = 1.0


__all__ = ["percentile"]  # tasks.output's, the one implementation (evals import it from here too)


class Comparison(NamedTuple):
    """Call-by-call output comparison of two runs of the same suite."""

    compared: int  # calls considered (the larger of the two runs' successful calls)
    identical: int  # calls whose prompt had a partner with the same greedy output

    @property
    def fraction(self) -> float | None:
        return self.identical / self.compared if self.compared else None


def compare_outputs(a: Sequence[CallRecord], b: Sequence[CallRecord]) -> Comparison:
    """Pair the calls of two runs by (prompt, occurrence) and count identical outputs.

    With greedy decoding the same prompt must give the same output in both modes. Pairing by prompt
    (not by position) keeps the comparison right when concurrent agents interleave differently; a
    call without a partner (its prompt never happened in the other run, because an earlier output
    diverged) counts as not identical. Failed calls are left out of both runs.
    """

    def keyed(calls: Sequence[CallRecord]) -> dict[tuple[str, int], CallRecord]:
        seen: Counter[str] = Counter()
        out = {}
        for call in calls:
            if call.error is None:
                out[(call.prompt_key, seen[call.prompt_key])] = call
                seen[call.prompt_key] += 1
        return out

    ka, kb = keyed(a), keyed(b)
    same = sum(1 for key, call in ka.items() if key in kb and kb[key].output_key == call.output_key)
    return Comparison(compared=max(len(ka), len(kb)), identical=same)


def mode_metrics(
    calls: Sequence[CallRecord],
    e2e_s: Sequence[float],
    accuracy: Sequence[float],
    identical: float | None,
    items: int,
) -> dict[str, Any]:
    """One mode of one suite. `e2e_s`/`accuracy`: one value per repeat (median / mean reported)."""
    ok = [c for c in calls if c.error is None]
    prompt = sum(c.prompt_tokens for c in ok)
    cached = sum(c.cached_tokens for c in ok)
    ttfts = [c.ttft_s for c in ok]
    return {
        "requests": len(ok),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "prefill_tokens_computed": prompt - cached,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "e2e_s": statistics.median(e2e_s) if e2e_s else None,
        "outputs_identical": identical,
        "accuracy": statistics.fmean(accuracy) if accuracy else None,
        # extensions
        "completion_tokens": sum(c.completion_tokens for c in ok),
        "latency_p50_s": percentile([c.latency_s for c in ok], 50),
        "failed_requests": len(calls) - len(ok),
        "items": items,
        "miss": miss_totals(ok),
    }


def miss_totals(calls: Sequence[CallRecord]) -> dict[str, int]:
    """Uncached prompt tokens by cause over the calls the ledger could account (issue 19)."""
    totals: dict[str, int] = {}
    for call in calls:
        for cause, n in (call.miss or {}).items():
            totals[cause] = totals.get(cause, 0) + n
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def ratio(slow: float | None, fast: float | None) -> float | None:
    """slow / fast, or None when either is missing or fast is zero."""
    if slow is None or fast is None or fast <= 0:
        return None
    return slow / fast


def suite_entry(
    cached: dict[str, Any] | None, uncached: dict[str, Any] | None, comparison: Comparison | None
) -> dict[str, Any]:
    """The per-suite object of results.json; a missing mode (interrupted run) gives None speedups."""
    entry: dict[str, Any] = {"cached": cached, "uncached": uncached}
    c, u = cached or {}, uncached or {}
    entry["speedup_ttft_p50"] = ratio(u.get("ttft_p50_s"), c.get("ttft_p50_s"))
    entry["speedup_e2e"] = ratio(u.get("e2e_s"), c.get("e2e_s"))
    if comparison is not None:
        entry["compared_calls"] = comparison.compared
        entry["identical_calls"] = comparison.identical
    return entry


def target_checks(name: str, entry: dict[str, Any]) -> list[tuple[str, float, float | None, bool | None]]:
    """(metric, target, measured, met) for the suite's targets; met is None when not measured."""
    checks = []
    for metric, target in TARGETS.get(name, {}).items():
        value = entry.get(metric)
        checks.append((metric, target, value, None if value is None else value >= target))
    value = (entry.get("cached") or {}).get("outputs_identical")
    checks.append(
        (
            "outputs_identical",
            IDENTICAL_TARGET,
            value,
            None if value is None else value >= IDENTICAL_TARGET - 1e-12,
        )
    )
    return checks


# ---- regressions against a previous results.json -----------------------------------------------
@dataclass(frozen=True, slots=True)
class RegressionRules:
    """Relative drop allowed for speedups; absolute drops allowed for fractions."""

    speedup_drop: float = 0.10
    identical_drop: float = 0.0
    accuracy_drop: float = 0.0
    hit_rate_drop: float = 0.02

    def __post_init__(self) -> None:
        if min(self.speedup_drop, self.identical_drop, self.accuracy_drop, self.hit_rate_drop) < 0:
            raise ValueError("regression tolerances must be >= 0")


class Regression(NamedTuple):
    suite: str
    metric: str
    before: float
    after: float
    note: str


def find_regressions(
    current: dict[str, Any], baseline: dict[str, Any], rules: RegressionRules | None = None
) -> list[Regression]:
    """Suites present in both results whose metrics got worse beyond `rules`."""
    rules = rules or RegressionRules()
    found: list[Regression] = []
    for name, now in (current.get("suites") or {}).items():
        before = (baseline.get("suites") or {}).get(name)
        if before is not None:
            found += _suite_regressions(name, now, before, rules)
    return found


def _suite_regressions(name: str, now: dict, before: dict, rules: RegressionRules) -> list[Regression]:
    out = []
    for metric in ("speedup_ttft_p50", "speedup_e2e"):
        b, a = before.get(metric), now.get(metric)
        if b and a is not None and a < b * (1 - rules.speedup_drop):
            out.append(
                Regression(
                    name,
                    metric,
                    b,
                    a,
                    f"dropped {100 * (1 - a / b):.0f}% (allowed {100 * rules.speedup_drop:.0f}%)",
                )
            )
    absolute = (
        ("outputs_identical", rules.identical_drop),
        ("accuracy", rules.accuracy_drop),
        ("hit_rate", rules.hit_rate_drop),
    )
    for metric, allowed in absolute:
        b = (before.get("cached") or {}).get(metric)
        a = (now.get("cached") or {}).get(metric)
        if b is not None and a is not None and a < b - allowed - 1e-12:
            out.append(Regression(name, metric, b, a, f"fell by {b - a:.3f} (allowed {allowed:.3f})"))
    return out
