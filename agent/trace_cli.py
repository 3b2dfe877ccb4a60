"""`radixagent trace FILE`: a per-step table of a JSONL trace and a one-line summary."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from agent.trace import MISS_CAUSES, StepRecord, read_trace

#: how the summary sentence names each cause
CAUSE_PHRASES = {
    "new": "new",
    "prompt_change": "a prompt change",
    "template_rewrite": "the chat template re-rendering earlier turns (e.g. dropping thinking)",
    "eviction": "evicted",
    "eviction_inferred": "evicted (inferred: the server does not say)",
    "namespace": "under another cache salt",
    "cache_off": "sent with the cache off",
    "routing": "routed away from the worker holding them",
    "last_token": "last tokens no engine caches",
    "granularity": "page remainders",
    "unexplained": "unexplained",
}
SHORT = {
    "prompt_change": "change",
    "template_rewrite": "tmpl",
    "eviction_inferred": "evict?",
    "eviction": "evict",
    "last_token": "last",
    "granularity": "page",
    "unexplained": "UNEXPL",
    "cache_off": "off",
    "namespace": "salt",
}


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


def _ranges(steps: list[int]) -> str:
    """[4, 7, 8, 9] -> "4, 7-9"."""
    out: list[str] = []
    for step in sorted(set(steps)):
        if out and step == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{step}"
        else:
            out.append(str(step))
    return ", ".join(out)


def miss_totals(records: list[StepRecord]) -> dict[str, int]:
    totals = {cause: 0 for cause in MISS_CAUSES}
    for r in records:
        for cause, n in (r.miss or {}).items():
            totals[cause] = totals.get(cause, 0) + n
    return {k: v for k, v in totals.items() if v}


def cause_sentence(records: list[StepRecord]) -> str:
    """ "92% of uncached tokens were new, 6% evicted at steps 7-9, 2% a prompt change at step 4:
    system message line 3 changed"."""
    totals = miss_totals(records)
    uncached = sum(totals.values())
    if not uncached:
        return "no uncached tokens" if records else "no steps"
    parts = []
    for cause, n in sorted(totals.items(), key=lambda kv: -kv[1]):
        steps = [r.step for r in records if (r.miss or {}).get(cause)]
        text = f"{n / uncached:.0%} {CAUSE_PHRASES.get(cause, cause)}"
        if cause != "new":
            text += f" at step{'s' if len(set(steps)) > 1 else ''} {_ranges(steps)}"
        if cause == "prompt_change":
            text += _change_phrase([r for r in records if (r.miss or {}).get(cause) and r.prefix_break])
        parts.append(text)
    first = parts[0].split(" ", 1)
    parts[0] = (
        f"{first[0]} of uncached tokens were {first[1]}"
        if first[1] == "new"
        else f"{first[0]} of uncached tokens: {first[1]}"
    )
    return ", ".join(parts)


def _change_phrase(broken: list[StepRecord]) -> str:
    """Which piece changed, the changing span, and whether it is the same offset on every
    step (a per-request value such as a date or hash near the start of the system prompt)."""
    breaks = [r.prefix_break for r in broken if r.prefix_break]
    if not breaks:
        return ""
    piece = next((b.get("piece") for b in breaks if b.get("piece")), None)
    text = f": {piece} changed" if piece else ""
    first = next((b for b in breaks if b.get("changed")), None)
    if first is not None:
        changed, unit = first["changed"], first.get("unit", "tokens")
        text += (
            f" ({changed['expected']} -> {changed['got']}, {changed['realigned']} {unit} after it unchanged)"
        )
    offsets = {b.get("offset") for b in breaks}
    if len(breaks) > 1 and len(offsets) == 1:
        text += (
            f"; the same offset ({offsets.pop()}) changed on every one of these {len(breaks)} steps: "
            "a per-request value near the start of the prompt (see docs/compat.md, per-request headers)"
        )
    return text


def miss_cell(record: StepRecord) -> str:
    if record.miss is None:
        return ""
    return " ".join(f"{SHORT.get(k, k)} {v}" for k, v in record.miss.items() if v)


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
        "miss",
    ):
        table.add_column(
            name, justify="right" if name not in ("session", "kind", "finish", "miss") else "left"
        )
    table.add_column("prefix break / tool")
    for r in records:
        brk = r.prefix_break
        note = (
            f"[red]BREAK @{brk.get('offset')} {brk.get('piece') or ''} {brk.get('expected')} -> {brk.get('got')}[/red]"
            if brk
            else _tool_cell(r)
        )
        table.add_row(
            r.session_id[-8:],
            str(r.branch),
            str(r.step),
            r.kind,
            str(r.prompt_tokens),
            str(r.cached_tokens),
            str(r.ideal_cached_tokens),
            str(r.completion_tokens),
            f"{r.ttft_s:.3f}",
            f"{r.latency_s:.3f}",
            r.finish_reason,
            miss_cell(r),
            note,
        )
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="radixagent trace", description="Show a per-step agent trace (JSONL)."
    )
    parser.add_argument("file", help="trace file written by Agent(trace_path=...)")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)  # piped: keep every column readable
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
    console.print(cause_sentence(records))
    return 0
