"""`radixagent eval-eviction --trace FILE --trace-format mooncake`: replay recorded traffic.

Bad input (a malformed trace line, an unknown policy, a capacity that cannot hold one request)
ends with one `error:` line on stderr and exit status 2, before any replay starts.
"""

from __future__ import annotations

import argparse
import time

from evals.eviction.mooncake import Trace, TraceError, load_mooncake
from evals.eviction.trace_grid import (
    TRACE_DEFINITION,
    TraceGrid,
    merge_results,
    run_trace_grid,
    trace_summary,
)
from evals.eviction.trace_replay import POLICIES, CostModel


def parse_capacities(text: str) -> tuple[int | None, ...]:
    out: list[int | None] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.lower() in ("inf", "infinite", "none"):
            out.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            raise ValueError(
                f"--capacities: {part!r} is neither a whole number of blocks nor 'inf'"
            ) from None
        if value <= 0:
            raise ValueError(f"--capacities: {value} is not a positive number of blocks")
        out.append(value)
    if not out:
        raise ValueError("--capacities: give at least one capacity")
    return tuple(out)


def grid_from(args: argparse.Namespace) -> TraceGrid:
    base = CostModel()
    prefill = (
        base.prefill_s_per_token if args.prefill_ms_per_token is None else args.prefill_ms_per_token / 1000
    )
    decode = base.decode_s_per_token if args.decode_ms_per_token is None else args.decode_ms_per_token / 1000
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    return TraceGrid(
        modes=modes,
        capacities=parse_capacities(args.capacities),
        policies=tuple(args.policies or POLICIES),
        cost=CostModel(prefill, decode),
    )


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    try:
        grid = grid_from(args)
        traces: list[Trace] = [load_mooncake(path) for path in args.trace]
        for trace in traces:
            grid.check(trace)
    except (TraceError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    total = sum(len(grid.runs()) * len(t.requests) for t in traces)
    start, rows = time.perf_counter(), []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        for trace in traces:
            rows += run_trace_grid(
                trace,
                grid,
                tick=lambda n: progress.advance(task, n),
                started=lambda s: progress.update(task, description=s),
            )
    wall = time.perf_counter() - start
    summaries = [trace_summary(t) for t in traces]
    merge_results(args.out / "results.json", rows, summaries)
    from evals.eviction.trace_report import write_trace_report

    paths = write_trace_report(rows, summaries, args.out, wall, TRACE_DEFINITION)
    for s in summaries:
        console.print(
            f"{s['workload']}: infinite-capacity block hit rate {s['infinite_block_hit_rate']:.4f} "
            f"(tokens {s['infinite_hit_rate']:.4f})",
            highlight=False,
        )
    console.print(
        f"{len(rows)} rows in {wall:.1f} s -> {args.out / 'results.json'}, {len(paths)} report files",
        highlight=False,
    )
    return 0
