"""`radixagent eval-misses`: inject every cache-miss cause, check the trace's attribution.

    radixagent eval-misses [--trials 100] [--served 10] [--seed 0] [--out DIR]

Prints a table (injected, found, wrong, unexplained tokens) per cause and path, and the overhead
of the bookkeeping on cached TTFT (engine eviction record on/off, and the ledger's own time per
step), each measured within this run. `--out DIR` writes results.json there.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evals.misses import inject, served
from evals.misses.common import Tally, random_ids


def overhead(engine: Any, rounds: int = 30, tokens: int = 1024) -> dict[str, float]:
    """Cached TTFT with the eviction record on and off (alternating, one engine), and the time
    the ledger takes to account one such step; ratios are within this run."""
    from runtime.backends.embedded import completion_from_output
    from runtime.trace.ledger import Served, SessionLedger, StepAccounting, StepEvent

    rng = random.Random(1)
    cache = engine.scheduler.cache
    record = cache.evictions
    for _ in range(4):  # a non-empty record: the on-runs pay for a real lookup
        engine.generate(input_ids=random_ids(rng, 256), sampling_params={"max_new_tokens": 1})
    with engine.scheduler.lock:
        cache.evict(cache.evictable_size)
    head = random_ids(rng, tokens)
    engine.generate(input_ids=head + [5], sampling_params={"max_new_tokens": 1})
    on: list[float] = []
    off: list[float] = []
    ledger_s: list[float] = []
    cached: list[int] = []
    for i in range(rounds):
        ids = head + random_ids(rng, 2)
        cache.evictions = record if i % 2 == 0 else None
        start = time.perf_counter()
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
        (on if i % 2 == 0 else off).append(time.perf_counter() - start)
        c = completion_from_output(out, 0.0)
        cached.append(c.cached_tokens)
        acc = StepAccounting(SessionLedger())
        acc.breaks.record(0, head + [5], [], None, None)
        start = time.perf_counter()
        acc.observe(StepEvent(0, ids, c.output_ids, ids, c.output_ids, Served(len(ids), c.cached_tokens, 0)))
        ledger_s.append(time.perf_counter() - start)
    cache.evictions = record
    ttft_on, ttft_off = statistics.median(on), statistics.median(off)
    return {
        "prompt_tokens": tokens + 2,
        "cached_tokens_min": min(cached),
        "cached_ttft_on_s": ttft_on,
        "cached_ttft_off_s": ttft_off,
        "record_ratio": ttft_on / ttft_off,
        "ledger_s": statistics.median(ledger_s),
        "ledger_ratio": (ttft_on + statistics.median(ledger_s)) / ttft_on,
    }


def table(tally: Tally) -> Table:
    out = Table(title="eval-misses: injected causes vs the trace's miss attribution")
    for name in ("path / cause", "injected", "found", "wrong", "unexplained tokens"):
        out.add_column(name, justify="left" if name.startswith("path") else "right")
    for kind, row in tally.rows.items():
        out.add_row(kind, *(str(v) for v in row))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="radixagent eval-misses", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trials", type=int, default=100, help="sessions on the embedded engine (each: every cause)"
    )
    parser.add_argument("--served", type=int, default=10, help="sessions per cause through serve --trace-dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-overhead", action="store_true", help="skip the TTFT overhead measurement")
    parser.add_argument("--out", default=None, help="write results.json here")
    args = parser.parse_args(argv)
    console = Console()
    start = time.perf_counter()
    engines = inject.build_engines()
    console.print(f"engines ready in {time.perf_counter() - start:.0f} s")
    try:
        tally = Tally()
        embedded = inject.run(
            engines, args.trials, args.seed, lambda n: console.print(f"embedded: {n} sessions")
        )
        tally.merge(embedded, "embedded: ")
        if args.served:
            tally.merge(served.run(engines, args.served, args.seed), "serve --trace-dir: ")
        cost = None if args.no_overhead else overhead(engines["main"])
    finally:
        for engine in engines.values():
            engine.shutdown()
    console.print(table(tally))
    for failure in tally.failures:
        console.print(f"[red]{failure}[/red]")
    if cost is not None:
        console.print(
            f"bookkeeping on cached TTFT ({cost['prompt_tokens']} tokens, >= {cost['cached_tokens_min']} cached): eviction record on/off "
            f"{cost['record_ratio']:.4f} ({cost['cached_ttft_on_s'] * 1e3:.1f} vs "
            f"{cost['cached_ttft_off_s'] * 1e3:.1f} ms); ledger {cost['ledger_s'] * 1e3:.2f} ms per step "
            f"(x{cost['ledger_ratio']:.4f})"
        )
    console.print(f"wall {time.perf_counter() - start:.0f} s")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        result = {
            "rows": tally.to_dict(),
            "failures": tally.failures,
            "overhead": cost,
            "trials": args.trials,
        }
        (Path(args.out) / "results.json").write_text(json.dumps(result, indent=2))
    return 0 if not tally.failures else 1
