"""results.json, calls.jsonl, resources.json, report.md and the PNG charts of an eval run.

`markdown_section(results)` is the part other reports embed (docs/benchmarks.md): ratios first,
then the per-mode table and a plain-language verdict per suite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.suites import charts, headlen
from evals.suites.metrics import Regression, RegressionRules, find_regressions, target_checks

ROWS = (  # (key, label, format) of the per-mode table
    ("requests", "requests", "{:,}"),
    ("prompt_tokens", "prompt tokens", "{:,}"),
    ("cached_tokens", "cached tokens", "{:,}"),
    ("hit_rate", "hit rate", "{:.1%}"),
    ("prefill_tokens_computed", "prefill tokens computed", "{:,}"),
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}"),
    ("ttft_p95_s", "TTFT p95 (s)", "{:.3f}"),
    ("e2e_s", "end-to-end (s)", "{:.1f}"),
    ("outputs_identical", "outputs identical", "{:.0%}"),
    ("accuracy", "accuracy", "{:.0%}"),
)
LABELS = {
    "speedup_ttft_p50": "TTFT p50",
    "speedup_e2e": "end-to-end",
    "outputs_identical": "identical outputs",
}


def fmt(value: Any, pattern: str = "{}") -> str:
    return "n/a" if value is None else pattern.format(value)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x" if value >= 1.95 else f"{value:.2f}x"


def verdict(name: str, entry: dict[str, Any]) -> str:
    """One plain sentence (or three) saying what the cache did for this suite."""
    c, u = entry.get("cached") or {}, entry.get("uncached") or {}
    if not c or not u:
        return f"{name}: incomplete (only {'cached' if c else 'uncached' if u else 'no'} mode measured)."
    ttft, e2e = entry.get("speedup_ttft_p50"), entry.get("speedup_e2e")
    parts = [f"cached TTFT p50 {_speed_words(ttft)}, end-to-end {_speed_words(e2e)}"]
    parts.append(
        f"{c['hit_rate']:.0%} of prompt tokens came from the cache "
        f"({c['prefill_tokens_computed']:,} prefilled instead of {u['prefill_tokens_computed']:,})"
    )
    same, compared = entry.get("identical_calls"), entry.get("compared_calls")
    if compared:
        parts.append(f"outputs identical in {same / compared:.0%} of {compared} calls")
    if c.get("accuracy") is not None:
        parts.append(f"accuracy {c['accuracy']:.0%} cached / {fmt(u.get('accuracy'), '{:.0%}')} uncached")
    checks = target_checks(name, entry)
    missed = [
        f"{LABELS[m]} {_x(v) if m != 'outputs_identical' else fmt(v, '{:.0%}')} < "
        f"{_x(t) if m != 'outputs_identical' else f'{t:.0%}'}"
        for m, t, v, ok in checks
        if ok is False
    ]
    status = "all targets met" if not missed else "target missed: " + ", ".join(missed)
    return f"**{name}**: " + "; ".join(parts) + f". {status.capitalize()}."


def _speed_words(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    if ratio >= 1.0:
        return f"{_x(ratio)} faster"
    return f"{(1 / ratio - 1):.1%} slower ({_x(ratio)})"


def markdown_section(results: dict[str, Any], heading: str = "## Agent suites: cached vs uncached") -> str:
    """Speedups and verdicts first, then cached/uncached per metric; embeddable in other reports."""
    suites = results.get("suites", {})
    lines = [heading, ""]
    if results.get("partial"):
        lines += ["> **Partial run** (interrupted or a suite failed): numbers cover what finished.", ""]
    lines += [
        f"Model `{results.get('model')}` on {results.get('backend')}; {results.get('machine')}.",
        f"Uncached baseline: {results.get('uncached_method')}.",
        "",
    ]
    lines += [
        "| suite | TTFT p50 speedup | end-to-end speedup | hit rate | identical outputs | targets |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in suites.items():
        c = e.get("cached") or {}
        checks = target_checks(name, e)
        met = (
            "met"
            if all(ok for *_, ok in checks)
            else "missed"
            if any(ok is False for *_, ok in checks)
            else "n/a"
        )
        lines.append(
            f"| {name} | {_x(e.get('speedup_ttft_p50'))} | {_x(e.get('speedup_e2e'))} | "
            f"{fmt(c.get('hit_rate'), '{:.1%}')} | {fmt(c.get('outputs_identical'), '{:.0%}')} | {met} |"
        )
    lines += [""] + [f"- {verdict(name, e)}" for name, e in suites.items()] + [""]
    lines += miss_lines(suites)
    lines += [
        "| metric | " + " | ".join(f"{n} cached | {n} uncached" for n in suites) + " |",
        "|---|" + "---|---|" * len(suites),
    ]
    for key, label, pattern in ROWS:
        cells = [
            fmt((e.get(m) or {}).get(key), pattern) for e in suites.values() for m in ("cached", "uncached")
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def miss_lines(suites: dict[str, Any]) -> list[str]:
    """Why prompt tokens were not cached (cached mode), per suite: the trace's `miss` causes."""
    out = []
    for name, e in suites.items():
        miss = (e.get("cached") or {}).get("miss") or {}
        total = sum(miss.values())
        if total:
            causes = ", ".join(f"{cause} {n / total:.0%} ({n})" for cause, n in miss.items())
            out.append(f"- {name}: uncached tokens by cause: {causes}")
    return (
        (["Uncached prompt tokens by cause (cached mode; runtime/trace/ledger.py):", ""] + out + [""])
        if out
        else []
    )


def report_markdown(
    results: dict[str, Any],
    chart_paths: list[Path],
    regressions: list[Regression] | None,
    baseline: str | None,
) -> str:
    cfg = results.get("config", {})
    head = [
        "# radixagent eval: cached vs uncached",
        "",
        f"Measured {results.get('created')} in {results.get('wall_s', 0):.0f} s: suites "
        f"{', '.join(cfg.get('suites', []))}; {cfg.get('repeats')} repeat(s); {cfg.get('warmup')} warm-up "
        f"request(s) per mode before measuring (not counted); items per suite: {_limits(cfg)}; concurrency {cfg.get('concurrency')}. Greedy decoding; "
        "TTFT percentiles over every model call; end-to-end = wall time of the whole suite.",
        "",
    ]
    body = [markdown_section(results, "## Results")]
    body += headlen.markdown(results.get("head_length") or {})
    body += _resources_md(results.get("resources") or {})
    if baseline is not None:
        body += _regressions_md(regressions or [], baseline)
    body += ["## Charts", ""] + [f"![{p.stem}]({p.name})" for p in chart_paths] + [""]
    return "\n".join(head + body)


def _limits(cfg: dict[str, Any]) -> str:
    per_suite = cfg.get("suite_limits") or {}
    default = "all" if cfg.get("limit") is None else f"at most {cfg['limit']}"
    return ", ".join(
        [f"{n} {k}" for n, k in per_suite.items()] + [f"{default} otherwise" if per_suite else default]
    )


def _resources_md(res: dict[str, Any]) -> list[str]:
    if not res.get("samples"):
        return []
    mib = 2**20

    def m(v: int | None) -> str:
        return "n/a" if v is None else f"{v / mib:,.0f} MiB"

    lines = [
        "## Memory",
        "",
        f"{res['samples']} samples: process RSS {m(res.get('rss_start_bytes'))} at start, "
        f"{m(res.get('rss_peak_bytes'))} at peak.",
    ]
    if res.get("pool_capacity_bytes"):
        lines.append(
            f"Prefix cache peak {m(res.get('cache_peak_bytes'))} of a {m(res['pool_capacity_bytes'])} "
            "KV pool: the pool is preallocated, so the cache can fill it but never grow past it "
            "(evicting instead)."
        )
    if res.get("gpu_peak_bytes") is not None:
        lines.append(f"GPU memory allocated at peak {m(res['gpu_peak_bytes'])}.")
    return lines + [""]


def _regressions_md(regressions: list[Regression], baseline: str) -> list[str]:
    lines = ["## Compared with the baseline", "", f"Baseline: `{baseline}`.", ""]
    if not regressions:
        return lines + ["No regressions.", ""]
    lines += ["| suite | metric | before | after | |", "|---|---|---|---|---|"]
    lines += [
        f"| {r.suite} | {r.metric} | {r.before:.3g} | {r.after:.3g} | REGRESSION: {r.note} |"
        for r in regressions
    ]
    return lines + [""]


def write_outputs(
    run: Any, out_dir: Path, baseline: str | Path | None = None, rules: RegressionRules | None = None
) -> list[Regression]:
    """Write every artefact of `run` (an `EvalRun`) into `out_dir`; the regressions against
    `baseline` (a previous results.json) are returned and recorded in results.json and report.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    regressions: list[Regression] = []
    if baseline is not None:
        regressions = find_regressions(run.results, json.loads(Path(baseline).read_text()), rules)
        run.results["baseline"] = str(baseline)
        run.results["regressions"] = [r._asdict() for r in regressions]
    (out_dir / "results.json").write_text(json.dumps(run.results, indent=1))
    with (out_dir / "calls.jsonl").open("w", encoding="utf-8") as handle:
        for r in run.runs:
            for call in r.calls:
                handle.write(
                    json.dumps({"suite": r.suite, "mode": r.mode, "repeat": r.repeat, **call.to_dict()})
                    + "\n"
                )
    (out_dir / "resources.json").write_text(json.dumps([s.to_dict() for s in run.samples]))
    pool = (run.results.get("resources") or {}).get("pool_capacity_bytes")
    made = [
        charts.ttft_per_step(run.runs, out_dir / "ttft_per_step.png"),
        charts.hit_rate_per_step(run.runs, out_dir / "hit_rate_per_step.png"),
        charts.speedup_per_suite(run.results, out_dir / "speedup.png"),
        charts.resources(run.samples, pool, out_dir / "memory.png"),
        headlen.chart(run.results.get("head_length") or {}, out_dir / "head_length.png"),
    ]
    paths = [p for p in made if p is not None]
    text = report_markdown(run.results, paths, regressions, None if baseline is None else str(baseline))
    (out_dir / "report.md").write_text(text)
    return regressions
