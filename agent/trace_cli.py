"""`radixagent trace FILE`: a per-step table of a JSONL trace and a one-line summary."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from agent.trace import StepRecord, read_trace


@dataclass(frozen=True, slots=True)
class TraceSummary:
    steps: int
    prompt_tokens: int
    cached_tokens: int
    ideal_cached_tokens: int
    breaks: int

    @property
    def fidelity(self) -> float:
        """cached / ideal: 1.0 means the cache hit everything a perfect cache could."""
        return self.cached_tokens / self.ideal_cached_tokens if self.ideal_cached_tokens else 1.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def summarize(records: list[StepRecord]) -> TraceSummary:
    return TraceSummary(
        steps=len(records),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        cached_tokens=sum(r.cached_tokens for r in records),
        ideal_cached_tokens=sum(r.ideal_cached_tokens for r in records),
        breaks=sum(r.prefix_break is not None for r in records),
    )


def _tool_cell(record: StepRecord) -> str:
    if not record.tool:
        return ""
    args = json.dumps(record.tool.get("arguments"), sort_keys=True, ensure_ascii=False)
    tail = f"error: {record.tool['error']}" if record.tool.get("error") else f"-> {record.tool.get('result')}"
    text = f"{record.tool.get('name')}({args}) {tail}"
    return text if len(text) <= 60 else text[:57] + "..."


def build_table(records: list[StepRecord]) -> Table:
    table = Table(title="trace", show_lines=False)
    for name in (
        "session",
        "br",
        "step",
        "kind",
        "prompt",
        "cached",
        "ideal",
        "out",
        "ttft s",
        "lat s",
        "finish",
    ):
        table.add_column(name, justify="right" if name not in ("session", "kind", "finish") else "left")
    table.add_column("prefix break / tool")
    for r in records:
        brk = r.prefix_break
        note = (
            f"[red]BREAK @{brk.get('offset')} {brk.get('expected')} -> {brk.get('got')}[/red]"
            if brk
            else _tool_cell(r)
        )
        table.add_row(
            r.session_id[-8:], str(r.branch), str(r.step), r.kind, str(r.prompt_tokens), str(r.cached_tokens),
            str(r.ideal_cached_tokens), str(r.completion_tokens), f"{r.ttft_s:.3f}", f"{r.latency_s:.3f}",
            r.finish_reason, note,
        )  # fmt: skip
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="radixagent trace", description="Show a per-step agent trace (JSONL)."
    )
    parser.add_argument("file", help="trace file written by Agent(trace_path=...)")
    args = parser.parse_args(argv)
    console = Console()
    try:
        records = read_trace(args.file)
    except (OSError, ValueError) as exc:
        console.print(f"[red]cannot read trace {args.file}: {exc}[/red]")
        return 2
    console.print(build_table(records))
    s = summarize(records)
    console.print(
        f"steps {s.steps} · prompt tokens {s.prompt_tokens} · cached tokens {s.cached_tokens} "
        f"(hit rate {s.hit_rate:.1%}) · ideal {s.ideal_cached_tokens} · "
        f"cache fidelity {s.fidelity:.3f} · breaks {s.breaks}"
    )
    return 0
