"""`radixagent eval-eviction`: compare eviction policies on simulated multi-session traces, or
(`--trace FILE --trace-format mooncake`) on a recorded production trace."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from evals.eviction.grid import GridConfig, run_grid, total_runs
from evals.eviction.report import write_report
from evals.eviction.simulator import POLICIES
from evals.eviction.workloads import WORKLOADS

QUICK = GridConfig(workloads=WORKLOADS, sessions=(8, 64), budgets=(0.25, 0.5, 1.0), seeds=1)


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="radixagent eval-eviction", description=__doc__)
    p.add_argument("--workloads", type=_csv(str), default=None, help=f"comma list of {','.join(WORKLOADS)}")
    p.add_argument("--sessions", type=_csv(int), default=None, help="comma list, default 8,32,64,256,1000")
    p.add_argument("--budgets", type=_csv(float), default=None, help="fractions, default 0.1,0.25,0.5,1")
    p.add_argument("--policies", type=_csv(str), default=None, help=f"comma list of {','.join(POLICIES)}")
    p.add_argument("--seeds", type=int, default=None, help="seeds per cell (mean reported), default 1")
    p.add_argument("--steps", type=_csv(int), default=None, help="MIN,MAX steps per session (override)")
    p.add_argument("--out", type=Path, default=Path("out/eviction"))
    p.add_argument("--quick", action="store_true", help="small grid (8 and 64 sessions, 3 budgets)")
    p.add_argument(
        "--real",
        action="store_true",
        help="instead: the small `agents` run on the embedded engine with the real model "
        "(evals/eviction/real.py; --sessions N and --budgets F take their first value, --steps passes)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=None,
        help="instead: replay this request trace (repeatable; evals/eviction/trace_cli.py)",
    )
    p.add_argument("--trace-format", choices=("mooncake",), default="mooncake")
    p.add_argument(
        "--capacities",
        default="1000,10000,30000,inf",
        help="trace replays: cache capacities in 512-token blocks, 'inf' = unbounded",
    )
    p.add_argument("--modes", default="hitrate,timed", help="trace replays: hitrate and/or timed")
    p.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=None,
        help="timed trace replay cost model (default 0.05: the Mooncake paper's LLaMA3-70B "
        "on 8xA800; this engine on 2 CPU cores measured ~2)",
    )
    p.add_argument(
        "--decode-ms-per-token",
        type=float,
        default=None,
        help="timed trace replay cost model (default 100: the paper's TBT threshold; this "
        "engine on 2 CPU cores measured ~80)",
    )
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> GridConfig:
    base = QUICK if args.quick else GridConfig()
    steps = args.steps
    if steps is not None and (len(steps) != 2 or not 0 < steps[0] <= steps[1]):
        raise ValueError("--steps takes MIN,MAX with 0 < MIN <= MAX")
    return GridConfig(
        workloads=args.workloads or base.workloads,
        sessions=args.sessions or base.sessions,
        budgets=args.budgets or base.budgets,
        policies=args.policies or base.policies,
        seeds=args.seeds or base.seeds,
        steps=steps or base.steps,
    )


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.progress import Progress

    args = parse(argv)
    if args.real:
        return _real(args)
    if args.trace:
        from evals.eviction import trace_cli

        return trace_cli.main(args)
    console = Console(stderr=True)
    try:
        cfg = config_from(args)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=total_runs(cfg))
        results = run_grid(cfg, tick=lambda: progress.advance(task))
    wall = time.perf_counter() - start
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    paths = write_report(results, args.out, wall)
    console.print(
        f"{len(results['rows'])} rows in {wall:.1f} s -> {args.out / 'results.json'}, "
        f"{len(paths)} report files"
    )
    return 0


def _real(args: argparse.Namespace) -> int:
    from evals.eviction import real

    forwarded = ["--out", str(args.out)]
    if args.sessions:
        forwarded += ["--sessions", str(args.sessions[0])]
    if args.budgets:
        forwarded += ["--budget", str(args.budgets[0])]
    if args.policies:
        forwarded += ["--policies", ",".join(args.policies)]
    if args.steps:
        forwarded += ["--steps", ",".join(map(str, args.steps))]
    return real.main(forwarded)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
