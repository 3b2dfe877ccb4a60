"""`radixagent demo`: the main job in a few minutes on 2 CPU cores.

A QA agent answers a few questions about a bundled ~2k-token document on the embedded engine. The
document is prefilled once (the leader request); every question then extends that prefix, so each
step prints how many of its prompt tokens the cache already held and how fast the first token came.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agent import Step, StepRecord
from agent.trace import read_trace
from agent.trace_cli import cause_sentence, miss_cell
from tasks.output import fmt_s
from tasks.qa import OnStep, QAReport
from tasks.qa_cli import summarize
from tasks.questions import Question

DEMO_DOC = "needle/doc_2048_0.txt"
DEMO_QUESTIONS = "needle/questions_2048_0.jsonl"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="radixagent demo",
        description="A long-document QA agent on the embedded engine, printing each step's cache hits.",
    )
    parser.add_argument(
        "--backend", default="embedded", help="embedded (default), http://host:port or openai:<url>"
    )
    parser.add_argument(
        "--questions", type=int, default=3, help="how many bundled questions (1-4, default 3)"
    )
    parser.add_argument(
        "--out", default=None, help="keep answers.jsonl and trace.jsonl here (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.questions <= 4:
        parser.error("--questions must be 1..4")
    return args


def step_printer(console: Console) -> OnStep:
    """Prints one line per model call as it happens: kind, prompt/cached tokens, TTFT, action."""

    def on_step(question: Question, step: Step) -> None:
        rec = step.record
        if rec is None:
            return
        what = step.action.kind if step.action is not None else (step.error or "-")
        if step.action is not None and step.action.kind == "answer":
            what = f"answer: {(step.action.text or '')[:70]!r}"
        elif step.tool is not None:
            what = f"{step.tool['name']}({step.tool['arguments']})"
        share = rec.cached_tokens / rec.prompt_tokens if rec.prompt_tokens else 0.0
        console.print(
            f"  [bold]{question.id}[/] step {rec.step} [cyan]{rec.kind:<9}[/] prompt {rec.prompt_tokens:>5} tok  "
            f"cached {rec.cached_tokens:>5} ({share:4.0%})  TTFT {rec.ttft_s:6.2f} s  {what}"
            f"  [dim]{miss_cell(rec)}[/]"
        )

    return on_step


def prefill_printer(console: Console) -> Callable[[StepRecord], None]:
    def on_prefill(rec: StepRecord) -> None:
        console.print(
            f"  [bold]document[/] prefill ({rec.kind}) prompt {rec.prompt_tokens:>5} tok  cached {rec.cached_tokens:>5}"
            f"  TTFT {rec.ttft_s:6.2f} s  (the leader request: computed once, reused by every question)"
        )

    return on_prefill


def final_table(report: QAReport) -> Table:
    s = summarize(report)
    speedup = s.prefill_ttft_s / s.ttft_p50_s if s.prefill_ttft_s and s.ttft_p50_s else None
    table = Table(title="radixagent demo: summary", header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(
        "questions answered / correct", f"{s.answered}/{s.questions} / {round((s.accuracy or 0) * s.judged)}"
    )
    table.add_row("cache hit rate (all calls incl. the document prefill)", f"{100 * s.hit_rate:.0f}%")
    table.add_row("cache fidelity (cached / ideal)", f"{100 * s.fidelity:.0f}%")
    table.add_row("TTFT computing the document (cold, leader)", fmt_s(s.prefill_ttft_s))
    table.add_row("TTFT first question (reusing it)", fmt_s(s.first_ttft_s))
    table.add_row("TTFT follow-up questions p50", fmt_s(s.followup_ttft_p50_s))
    table.add_row(
        "TTFT speedup (cold document / question p50)", "-" if speedup is None else f"{speedup:.1f}x"
    )
    table.add_row("end-to-end", fmt_s(s.e2e_s))
    return table


def main(argv: list[str]) -> int:
    from tasks import data_path
    from tasks.backend_setup import open_backend
    from tasks.documents import load_document
    from tasks.qa import run_qa
    from tasks.questions import load_questions

    args = parse_args(argv)
    console = Console()
    doc = load_document(data_path(DEMO_DOC))
    questions = load_questions(data_path(DEMO_QUESTIONS))[: args.questions]
    console.print(
        f"[bold]radixagent demo[/]: {len(questions)} questions about {DEMO_DOC} (backend {args.backend})"
    )
    with console.status("loading the model..."):
        backend = open_backend(args.backend)
    out = args.out or tempfile.mkdtemp(prefix="radixagent-demo-")
    console.print("prefilling the document once, then answering (each line is one model call):")
    try:
        report = run_qa(
            backend,
            doc,
            questions,
            out_dir=out,
            on_step=step_printer(console),
            on_prefill=prefill_printer(console),
        )
    finally:
        backend.close()
    for result in sorted(report.results, key=lambda r: r.row["id"]):
        row = result.row
        correct = row.get("correct")
        mark = "" if correct is None else "[green]correct[/]" if correct else "[red]wrong[/]"
        cites = [f"P{n}" for n in row.get("paragraphs") or []] or [f"L{n}" for n in row["citations"]]
        console.print(f"  {row['id']}: {row['answer']!r} cites {', '.join(cites) or '-'} {mark}")
    console.print(final_table(report))
    trace = Path(out) / "trace.jsonl"
    if trace.exists():  # why the rest was not cached (issue 19)
        console.print(f"uncached tokens: {cause_sentence(read_trace(trace))}")
    console.print(f"trace: {out}/trace.jsonl  (radixagent trace {out}/trace.jsonl)")
    return 130 if report.interrupted else 0
