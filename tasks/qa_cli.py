"""`radixagent qa`: argument parsing, input checks, and the summary table of a QA run."""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

from tasks.errors import TaskInputError
from tasks.output import fmt_s, hit_rate, percentile
from tasks.qa import QAReport, QAResult


class QASummary(NamedTuple):
    """Figures of one QA run. TTFTs are of each question's first model call."""

    questions: int
    answered: int
    judged: int  # questions with a gold answer
    accuracy: float | None  # gold contained in the answer (normalized), over judged questions
    exact: float | None
    f1: float | None
    hit_rate: float  # cached / prompt tokens over every call, the head's prefill included
    question_hit_rate: float  # the same over the questions' calls only
    fidelity: float  # cached / ideal cached tokens
    prefill_ttft_s: float | None  # the leader request: the document computed from scratch (or reused)
    first_ttft_s: float | None  # the first question
    followup_ttft_p50_s: float | None  # the other questions
    ttft_p50_s: float | None  # every model call of the questions
    e2e_s: float
    interrupted: bool


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _first_ttfts(results: list[QAResult]) -> list[float]:
    ordered = sorted((r for r in results if r.records), key=lambda r: r.records[0].branch)
    return [r.records[0].ttft_s for r in ordered]


def summarize(report: QAReport) -> QASummary:
    rows = [r.row for r in report.results]
    judged = [row for row in rows if "correct" in row]
    calls = [rec for res in report.results for rec in res.records]
    records = report.records
    ideal = sum(r.ideal_cached_tokens for r in records)
    firsts = _first_ttfts(report.results)
    return QASummary(
        questions=len(rows),
        answered=sum(row["status"] == "answered" for row in rows),
        judged=len(judged),
        accuracy=_mean([float(row["correct"]) for row in judged]),
        exact=_mean([row["exact"] for row in judged]),
        f1=_mean([row["f1"] for row in judged]),
        hit_rate=hit_rate(records),
        question_hit_rate=hit_rate(calls),
        fidelity=sum(r.cached_tokens for r in records) / ideal if ideal else 1.0,
        prefill_ttft_s=report.prefill.ttft_s if report.prefill else None,
        first_ttft_s=firsts[0] if firsts else None,
        followup_ttft_p50_s=percentile(firsts[1:], 50),
        ttft_p50_s=percentile([r.ttft_s for r in calls], 50),
        e2e_s=report.e2e_s,
        interrupted=report.interrupted,
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def summary_table(summary: QASummary, title: str = "QA summary") -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    answered = f"{summary.answered}/{summary.questions}" + (" (interrupted)" if summary.interrupted else "")
    rows = [
        ("questions answered", answered),
        (f"accuracy (gold contained, {summary.judged} judged)", _pct(summary.accuracy)),
        ("exact match / token F1", f"{_pct(summary.exact)} / {_pct(summary.f1)}"),
        (
            "cache hit rate (all calls / questions)",
            f"{_pct(summary.hit_rate)} / {_pct(summary.question_hit_rate)}",
        ),
        ("cache fidelity (cached / ideal)", _pct(summary.fidelity)),
        ("TTFT document prefill (leader)", fmt_s(summary.prefill_ttft_s)),
        ("TTFT first question", fmt_s(summary.first_ttft_s)),
        ("TTFT follow-up questions p50", fmt_s(summary.followup_ttft_p50_s)),
        ("TTFT p50 (every question call)", fmt_s(summary.ttft_p50_s)),
        ("end-to-end", fmt_s(summary.e2e_s)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="radixagent qa",
        description="Answer questions about a long document with a tool-using agent that cites lines; "
        "the document is prefilled once and every question reuses it from the prefix cache.",
    )
    parser.add_argument("--doc", required=True, help="document: plain text, Markdown or PDF")
    parser.add_argument("--questions", required=True, help="JSONL: question, optional answer (gold) and id")
    parser.add_argument(
        "--backend", default="embedded", help="embedded (default), http://host:port or openai:<url>"
    )
    parser.add_argument("--no-cache", action="store_true", help="send prefix_cache=false on every request")
    parser.add_argument("--concurrency", type=int, default=1, help="questions answered at once (default 1)")
    parser.add_argument("--out", default="qa-out", help="output folder (answers.jsonl, trace.jsonl)")
    parser.add_argument("--max-steps", type=int, default=4, help="model calls per question at most")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.max_steps < 1:
        parser.error("--concurrency and --max-steps must be >= 1")
    return args


def main(argv: list[str]) -> int:
    from tasks.backend_setup import open_backend, with_cache
    from tasks.documents import load_document
    from tasks.qa import run_qa
    from tasks.questions import load_questions

    args = parse_args(argv)
    console = Console()
    try:
        doc, questions = load_document(args.doc), load_questions(args.questions)
        backend = with_cache(open_backend(args.backend), not args.no_cache)
        try:
            report = run_qa(
                backend,
                doc,
                questions,
                concurrency=args.concurrency,
                out_dir=args.out,
                progress=True,
                max_steps=args.max_steps,
            )
        finally:
            backend.close()
    except TaskInputError as exc:
        print(f"radixagent qa: error: {exc}", file=sys.stderr)
        return 2
    console.print(summary_table(summarize(report), title=f"QA summary: {doc.path}"))
    console.print(f"answers: {args.out}/answers.jsonl   trace: {args.out}/trace.jsonl")
    return 130 if report.interrupted else 0
