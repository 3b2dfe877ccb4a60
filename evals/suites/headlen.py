"""Accuracy and TTFT vs head length: the QA agent with 0, 1, 2, 4, 8 worked examples in its head.

For each example count the same questions run uncached (every call prefills the whole head) and
cached (the head is prefilled once by the leader request, then every call reuses it). Uncached,
TTFT grows with every example; cached, it stays flat after that first call: a many-shot head is
free once the prefix cache holds it. Greedy decoding: accuracy is the same in both modes (it is
measured in both and reported per mode).

`run_head_sweep(setup, config)` returns the `head_length` entry of results.json:
`{"doc", "questions", "rows": [{"examples", "head_tokens", "prefill_ttft_s", "cached": {...},
"uncached": {...}}]}`, each mode with `accuracy`, `ttft_p50_s` (the questions' calls, the leader's
prefill excluded) and `calls`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evals.suites.backends import EvalSetup
from tasks.backend_setup import with_cache
from tasks.output import percentile

COUNTS = (0, 1, 2, 4, 8)
DOC = "needle/doc_1024_0.txt"
QUESTIONS = "needle/questions_1024_0.jsonl"


@dataclass(frozen=True, slots=True)
class SweepConfig:
    counts: tuple[int, ...] = COUNTS
    questions: int = 2
    doc: str = DOC
    question_file: str = QUESTIONS

    def __post_init__(self) -> None:
        if not self.counts or min(self.counts) < 0 or self.questions < 1:
            raise ValueError("head sweep: counts must be >= 0 and questions >= 1")


def run_head_sweep(setup: EvalSetup, config: SweepConfig | None = None) -> dict[str, Any]:
    from tasks import data_path
    from tasks.documents import load_document
    from tasks.questions import load_questions

    config = config or SweepConfig()
    doc = load_document(data_path(config.doc))
    questions = load_questions(data_path(config.question_file))[: config.questions]
    rows = []
    for count in config.counts:
        row: dict[str, Any] = {"examples": count}
        for mode in ("uncached", "cached"):
            row.update(_one(setup, doc, questions, count, mode))
        rows.append(row)
    return {"doc": config.doc, "questions": len(questions), "rows": rows}


def _one(setup: EvalSetup, doc: Any, questions: Sequence[Any], count: int, mode: str) -> dict[str, Any]:
    from tasks.qa import run_qa

    if mode == "cached":
        setup.cached.flush_cache()  # the head is computed once, inside this run
        backend = setup.cached
    else:
        backend = with_cache(setup.uncached, False)
    report = run_qa(backend, doc, questions, examples=count)
    report.raise_if_interrupted()
    calls = [r for res in report.results for r in res.records]
    judged = [bool(res.row["correct"]) for res in report.results if res.row.get("correct") is not None]
    entry: dict[str, Any] = {
        mode: {
            "accuracy": sum(judged) / len(judged) if judged else None,
            "ttft_p50_s": percentile([c.ttft_s for c in calls], 50),
            "calls": len(calls),
        }
    }
    if mode == "cached" and report.prefill is not None:
        entry["head_tokens"] = report.prefill.prompt_tokens
        entry["prefill_ttft_s"] = report.prefill.ttft_s
    return entry


def markdown(sweep: dict[str, Any]) -> list[str]:
    """The report.md section: one row per example count."""
    if not sweep or not sweep.get("rows"):
        return []
    lines = [
        "## Accuracy and TTFT vs head length",
        "",
        f"QA agent on `{sweep['doc']}`, {sweep['questions']} question(s), 0..N worked examples in the "
        "head. Cached TTFT p50 is over the questions' calls (the head's one-time prefill is its own "
        "column): it stays flat while the uncached TTFT grows with every example.",
        "",
        "| examples | head tokens | head prefill, once (s) | TTFT p50 uncached (s) | TTFT p50 cached (s) "
        "| accuracy uncached | accuracy cached |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sweep["rows"]:
        c, u = row.get("cached") or {}, row.get("uncached") or {}
        lines.append(
            f"| {row['examples']} | {_f(row.get('head_tokens'), '{:,}')} | {_f(row.get('prefill_ttft_s'))} "
            f"| {_f(u.get('ttft_p50_s'))} | {_f(c.get('ttft_p50_s'))} | {_f(u.get('accuracy'), '{:.0%}')} "
            f"| {_f(c.get('accuracy'), '{:.0%}')} |"
        )
    return lines + [""]


def _f(value: Any, pattern: str = "{:.3f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def chart(sweep: dict[str, Any], path: Any) -> Any:
    """TTFT (log) vs worked examples, cached and uncached, with accuracy on a second axis."""
    rows = (sweep or {}).get("rows") or []
    if not rows:
        return None
    from evals.suites.charts import COLORS, _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [r["examples"] for r in rows]
    for mode in ("uncached", "cached"):
        ys = [(r.get(mode) or {}).get("ttft_p50_s") or float("nan") for r in rows]
        ax.plot(xs, ys, marker="o", color=COLORS[mode], label=f"TTFT p50, {mode}")
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{r['examples']}\n{r.get('head_tokens') or '?'} tok" for r in rows], fontsize=8)
    ax.set(
        xlabel="worked examples in the head (head tokens)",
        ylabel="TTFT per call (s, log scale)",
        title="QA agent: TTFT and accuracy vs head length",
    )
    acc = ax.twinx()
    acc.plot(
        xs,
        [100 * ((r.get("cached") or {}).get("accuracy") or 0) for r in rows],
        color="#264653",
        linestyle="dashed",
        marker="s",
        label="accuracy",
    )
    acc.set(ylabel="accuracy (%)", ylim=(0, 105))
    handles = ax.get_legend_handles_labels()[0] + acc.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="center right")
    return _save(fig, plt, path)
