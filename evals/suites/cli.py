"""`radixagent eval`: every suite twice on the same backend, cached and uncached, side by side.

Writes results.json, report.md, calls.jsonl, resources.json and PNG charts into --out.
Ctrl-C stops early and still writes what was measured (flagged partial; exit code 130).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evals.suites.backends import METHODS, open_setup
from evals.suites.metrics import RegressionRules
from evals.suites.recording import CallRecord
from evals.suites.run import REDUCED, SUITE_NAMES, EvalConfig, Listener, ModeRun, run_eval


def _suites(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SUITE_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown suite(s) {unknown}; choose from {','.join(SUITE_NAMES)}")
    return names


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="radixagent eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--suite", type=_suites, default=SUITE_NAMES, help="comma list (default: all)")
    p.add_argument("--backend", default="embedded", help="embedded (default) or a server URL")
    p.add_argument(
        "--uncached-backend",
        default=None,
        metavar="URL",
        help="a second server started with --disable-radix-cache for the uncached mode",
    )
    p.add_argument(
        "--uncached-method",
        choices=METHODS,
        default="auto",
        help="server URL only: prefix_cache=false per request (flag), flush before every "
        "request (flush), or probe the server (auto, default)",
    )
    p.add_argument(
        "--warmup", type=int, default=None, help="warm-up requests per mode, not counted (default 3)"
    )
    p.add_argument("--repeats", type=int, default=1, help="runs of each suite per mode (default 1)")
    p.add_argument("--limit", type=int, default=None, help="at most N items per suite")
    p.add_argument("--concurrency", type=int, default=1, help="agents in flight per suite (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--reduced",
        action="store_true",
        help="the `make bench` configuration: a few items per suite (--limit overrides)",
    )
    p.add_argument(
        "--head-sweep",
        type=int,
        default=2,
        metavar="N",
        help="questions of the accuracy/TTFT-vs-head-length sweep, run with longdoc (0: off; default 2)",
    )
    p.add_argument("--max-total-tokens", type=int, default=None, help="embedded: KV pool size in tokens")
    p.add_argument("--out", type=Path, default=Path("out/eval"), help="output folder (default out/eval)")
    p.add_argument("--baseline", type=Path, default=None, help="a previous results.json to compare with")
    p.add_argument(
        "--fail-on-regression", action="store_true", help="exit 1 when --baseline shows a regression"
    )
    p.add_argument(
        "--speedup-tolerance",
        type=float,
        default=0.10,
        help="relative speedup drop flagged as a regression (default 0.10)",
    )
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> EvalConfig:
    base = REDUCED if args.reduced else EvalConfig()
    return EvalConfig(
        suites=args.suite,
        warmup=base.warmup if args.warmup is None else args.warmup,
        repeats=args.repeats,
        limit=args.limit,
        suite_limits=() if args.limit is not None else base.suite_limits,
        seed=args.seed,
        concurrency=args.concurrency,
        head_sweep_questions=args.head_sweep,
    )


class RichListener(Listener):
    """One progress bar per suite × mode, counting model calls (suites report no totals up front)."""

    def __init__(self, progress) -> None:
        self.progress, self.task = progress, None

    def phase(self, suite: str, mode: str, repeat: int) -> None:
        self.task = self.progress.add_task(f"{suite:<9} {mode:<8} #{repeat + 1}", total=None)

    def call(self, record: CallRecord) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def done(self, run: ModeRun) -> None:
        if self.task is not None:
            status = "[red]failed[/red]" if run.error else f"{run.wall_s:.1f} s"
            self.progress.update(
                self.task,
                total=len(run.calls),
                completed=len(run.calls),
                description=f"{run.suite:<9} {run.mode:<8} #{run.repeat + 1} {status}",
            )


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn

    args = parse(argv)
    console = Console(stderr=True)
    try:
        config = config_from(args)
        rules = RegressionRules(speedup_drop=args.speedup_tolerance)
        if args.baseline is not None and not args.baseline.is_file():
            raise ValueError(f"--baseline {args.baseline}: no such file")
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    engine_options = {"max_total_tokens": args.max_total_tokens} if args.max_total_tokens else {}
    with console.status(f"connecting to {args.backend} ..."):
        try:
            setup = open_setup(
                args.backend,
                concurrency=args.concurrency,
                method=args.uncached_method,
                uncached_target=args.uncached_backend,
                **engine_options,
            )
        except Exception as exc:  # a bad URL / server down / engine config: say so, no traceback
            console.print(f"[red]error:[/red] cannot open {args.backend}: {exc}")
            return 2
    columns = (
        SpinnerColumn(),
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        "calls",
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console) as progress:
            run = run_eval(setup, config, RichListener(progress))
    finally:
        setup.close()
    return _finish(run, args, rules, console)


def _finish(run, args: argparse.Namespace, rules: RegressionRules, console) -> int:
    from evals.suites.report import verdict, write_outputs

    regressions = write_outputs(run, args.out, args.baseline, rules)
    for name, entry in run.results["suites"].items():
        console.print(verdict(name, entry).replace("**", ""))
    for r in regressions:
        console.print(
            f"[red]regression[/red] {r.suite} {r.metric}: {r.before:.3g} -> {r.after:.3g} ({r.note})"
        )
    console.print(f"report: {args.out / 'report.md'}")
    if run.results.get("partial"):
        console.print("[yellow]partial results[/yellow] (interrupted or a suite failed)")
        if run.results.get("interrupted"):
            return 130
    return 1 if regressions and args.fail_on_regression else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
