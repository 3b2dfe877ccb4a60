"""PNG charts of an eval run (matplotlib, Agg): TTFT per step for one agent run, hit rate per step,
speedup per suite, memory over time. Each function returns the path written, or None when the run
has no data for that chart."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.suites.metrics import TARGETS
from evals.suites.resources import Sample

COLORS = {"cached": "#2a9d8f", "uncached": "#e76f51"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _field(step: Any, name: str) -> Any:
    """A StepRecord attribute, or a key of a plain dict step."""
    return step.get(name) if isinstance(step, dict) else getattr(step, name, None)


def pick_agent_run(runs: Sequence[Any]) -> tuple[str, str, list[Any], list[Any]] | None:
    """(suite, item_id, cached steps, uncached steps) of the longest item present in both modes of
    repeat 0, preferring longdoc, then reasoning, then any suite."""
    best = None
    preferred = ("longdoc", "reasoning", "chat")
    for suite in preferred + tuple(sorted({r.suite for r in runs} - set(preferred))):
        by_mode = {r.mode: r.outcome for r in runs if r.suite == suite and r.repeat == 0 and r.outcome}
        if "cached" not in by_mode or "uncached" not in by_mode:
            continue
        other = {i.item_id: i.steps for i in by_mode["uncached"].items}
        for item in by_mode["cached"].items:
            if item.steps and other.get(item.item_id) and (best is None or len(item.steps) > len(best[2])):
                best = (suite, item.item_id, list(item.steps), list(other[item.item_id]))
        if best is not None and len(best[2]) > 1:
            return best
    return best


def ttft_per_step(runs: Sequence[Any], path: Path) -> Path | None:
    picked = pick_agent_run(runs)
    if picked is None:
        return None
    suite, item_id, cached, uncached = picked
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for mode, steps in (("uncached", uncached), ("cached", cached)):
        ax.plot(
            range(1, len(steps) + 1),
            [_field(s, "ttft_s") or 0.0 for s in steps],
            marker="o",
            color=COLORS[mode],
            label=mode,
        )
    kinds = [str(_field(s, "kind") or "") for s in cached]
    ax.set_xticks(range(1, len(cached) + 1), [f"{i}\n{k}" for i, k in enumerate(kinds, 1)], fontsize=7)
    ax.set_yscale("log")
    ax.set(
        xlabel="model call (step, kind)",
        ylabel="TTFT (s, log scale)",
        title=f"TTFT per step, one agent run: {suite} / {item_id}",
    )
    ax.legend()
    return _save(fig, plt, path)


def hit_rate_per_step(runs: Sequence[Any], path: Path) -> Path | None:
    """Mean cached/prompt tokens at each step index of the suites' items (cached mode, repeat 0)."""
    lines: dict[str, list[float]] = {}
    for run in runs:
        if run.mode != "cached" or run.repeat != 0 or run.outcome is None:
            continue
        per_step: dict[int, list[float]] = defaultdict(list)
        for item in run.outcome.items:
            for i, step in enumerate(item.steps):
                prompt = _field(step, "prompt_tokens") or 0
                if prompt:
                    per_step[i].append((_field(step, "cached_tokens") or 0) / prompt)
        if per_step:
            lines[run.suite] = [sum(v) / len(v) for _, v in sorted(per_step.items())]
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for suite, rates in lines.items():
        ax.plot(range(1, len(rates) + 1), [100 * r for r in rates], marker="o", label=suite)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set(
        xlabel="step within an item (agent run or chat)",
        ylabel="prompt tokens from cache (%)",
        ylim=(0, 105),
        title="Cache hit rate per step (cached mode, mean over items)",
    )
    ax.legend()
    return _save(fig, plt, path)


def speedup_per_suite(results: dict[str, Any], path: Path) -> Path | None:
    suites = [
        (n, e)
        for n, e in results.get("suites", {}).items()
        if e.get("speedup_ttft_p50") is not None or e.get("speedup_e2e") is not None
    ]
    if not suites:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    for k, (metric, label) in enumerate((("speedup_ttft_p50", "TTFT p50"), ("speedup_e2e", "end-to-end"))):
        xs = [i + (k - 0.5) * width for i in range(len(suites))]
        values = [e.get(metric) or 0.0 for _, e in suites]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, labels=[f"{v:.1f}x" for v in values], fontsize=8)
        for x, (name, _) in zip(xs, suites, strict=True):
            target = TARGETS.get(name, {}).get(metric)
            if target:
                ax.hlines(target, x - width / 2, x + width / 2, colors="black", linestyles="dashed")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(suites)), [n for n, _ in suites])
    ax.set_yscale("log")
    ax.set(ylabel="uncached / cached (x, log scale)", title="Speedup per suite (dashes: targets)")
    ax.legend()
    return _save(fig, plt, path)


def resources(samples: Sequence[Sample], pool_capacity_bytes: int | None, path: Path) -> Path | None:
    """Top: process RSS (and GPU memory). Bottom: the prefix cache's KV bytes against the pool size."""
    if len(samples) < 2:
        return None
    plt = _plt()
    has_cache = any(s.cache_bytes is not None for s in samples)
    fig, axes = plt.subplots(
        2 if has_cache else 1, 1, figsize=(9, 6 if has_cache else 3.5), sharex=True, squeeze=False
    )
    top = axes[0][0]
    ts, mib = [s.t_s for s in samples], 2**20
    top.plot(ts, [s.rss_bytes / mib for s in samples], color="#264653", label="process RSS")
    if any(s.gpu_bytes is not None for s in samples):
        top.plot(
            ts, [(s.gpu_bytes or 0) / mib for s in samples], color="#8338ec", label="GPU memory allocated"
        )
    top.set(ylabel="MiB", title="Memory during the eval (shaded: cached phases)")
    top.set_ylim(0, max(s.rss_bytes for s in samples) / mib * 1.2)
    top.legend(fontsize=8, loc="lower right")
    _shade_phases(top, samples)
    if has_cache:
        low = axes[1][0]
        low.plot(
            ts,
            [(s.cache_bytes or 0) / mib for s in samples],
            color=COLORS["cached"],
            label="prefix cache in use (KV)",
        )
        if pool_capacity_bytes:
            low.axhline(
                pool_capacity_bytes / mib, color="black", linestyle="dashed", label="KV pool capacity"
            )
        peak = max([s.cache_bytes or 0 for s in samples] + [pool_capacity_bytes or 0])
        low.set(ylabel="MiB", ylim=(0, max(peak / mib * 1.15, 1.0)))
        low.legend(fontsize=8, loc="lower right")
        _shade_phases(low, samples, labels=False)
    axes[-1][0].set_xlabel("time since start (s)")
    return _save(fig, plt, path)


def _shade_phases(ax: Any, samples: Sequence[Sample], labels: bool = True) -> None:
    """Light bands for the cached phases, with each phase's name at the top."""
    start = 0
    for i in range(1, len(samples) + 1):
        if i == len(samples) or samples[i].phase != samples[start].phase:
            phase = samples[start].phase
            if "/" in phase:
                t0, t1 = samples[start].t_s, samples[i - 1].t_s
                if phase.endswith("/cached"):
                    ax.axvspan(t0, t1, color=COLORS["cached"], alpha=0.08)
                if labels:
                    ax.text(
                        (t0 + t1) / 2,
                        0.97,
                        phase.replace("/", "\n"),
                        transform=ax.get_xaxis_transform(),
                        ha="center",
                        va="top",
                        fontsize=6,
                    )
            start = i


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
