"""The eval loop: every suite twice on the same backend (uncached, then cached), warm-up first,
each call recorded, memory sampled; then the DESIGN.md "Eval results" object.

`run_eval(setup, config)` never raises KeyboardInterrupt: Ctrl-C ends the loop and the results
are built from what was measured so far, flagged `"partial": true`.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evals.suites.backends import EvalSetup, embedded_setup
from evals.suites.metrics import Comparison, compare_outputs, mode_metrics, suite_entry
from evals.suites.recording import CallRecord, RecordingBackend
from evals.suites.resources import ResourceSampler, Sample, summarize
from tasks.suites import SuiteOptions, SuiteOutcome, run_suite

SUITE_NAMES = ("longdoc", "reasoning", "chat")
MODES = ("cached", "uncached")
WARMUP_PROMPT = "Warm-up request {i}. Reply with one short word."


@dataclass(frozen=True, slots=True)
class EvalConfig:
    suites: tuple[str, ...] = SUITE_NAMES
    warmup: int = 3
    repeats: int = 1
    limit: int | None = None
    #: per-suite limits overriding `limit`, e.g. (("chat", 6),)
    suite_limits: tuple[tuple[str, int], ...] = ()
    seed: int = 0
    concurrency: int = 1
    sample_interval_s: float = 0.5
    #: questions of the accuracy/TTFT-vs-head-length sweep (evals/suites/headlen.py), run with longdoc; 0: off
    head_sweep_questions: int = 2

    def __post_init__(self) -> None:
        if not self.suites:
            raise ValueError("no suite selected")
        if self.warmup < 0 or self.repeats < 1 or self.concurrency < 1 or self.head_sweep_questions < 0:
            raise ValueError("warmup must be >= 0, repeats and concurrency >= 1")
        limits = [self.limit] if self.limit is not None else []
        if any(n < 1 for n in limits + [n for _, n in self.suite_limits]):
            raise ValueError("limits must be >= 1")

    def limit_for(self, suite: str) -> int | None:
        return dict(self.suite_limits).get(suite, self.limit)


#: `make bench`: a few items per suite, one repeat; ~5-8 minutes on 2 CPU cores (fp32 default model).
REDUCED = EvalConfig(warmup=2, suite_limits=(("longdoc", 4), ("reasoning", 3), ("chat", 6)))


@dataclass(slots=True)
class ModeRun:
    """One suite in one mode, one repeat. `outcome` is None when it failed or was interrupted."""

    suite: str
    mode: str
    repeat: int
    calls: list[CallRecord]
    outcome: SuiteOutcome | None
    wall_s: float
    error: str | None = None


@dataclass(slots=True)
class EvalRun:
    results: dict[str, Any]
    runs: list[ModeRun]
    samples: list[Sample] = field(default_factory=list)


class Listener:
    """Progress hooks (no-ops here; the CLI draws rich progress bars)."""

    def phase(self, suite: str, mode: str, repeat: int) -> None:
        """A suite is about to run in `mode`."""

    def call(self, record: CallRecord) -> None:
        """A model call finished (any thread)."""

    def done(self, run: ModeRun) -> None:
        """A suite finished in one mode."""


def run_eval(setup: EvalSetup, config: EvalConfig, listener: Listener | None = None) -> EvalRun:
    listener = listener or Listener()
    recorders = {
        "cached": RecordingBackend(setup.cached, True, on_call=listener.call),
        "uncached": RecordingBackend(
            setup.uncached, False, flush_each=setup.flush_each, on_call=listener.call
        ),
    }
    sampler = ResourceSampler(config.sample_interval_s, setup.cache_probe).start()
    runs: list[ModeRun] = []
    started, partial = time.perf_counter(), False
    try:
        warm_up(setup, config.warmup)
        for name in config.suites:
            for repeat in range(config.repeats):
                # uncached first (the baseline, as the seed asks); alternate on later repeats
                order = ("uncached", "cached") if repeat % 2 == 0 else ("cached", "uncached")
                for mode in order:
                    listener.phase(name, mode, repeat)
                    runs.append(_run_mode(setup, recorders[mode], name, mode, repeat, config, sampler))
                    listener.done(runs[-1])
        sweep = _head_sweep(setup, config, sampler)
    except KeyboardInterrupt:
        partial, sweep = True, None
        _keep_interrupted(runs, recorders, sampler.phase)
    samples = sampler.stop()
    results = build_results(setup, config, runs, partial, time.perf_counter() - started)
    if sweep is not None:
        results["head_length"] = sweep
    results["interrupted"] = partial
    results["resources"] = summarize(samples, sampler.pool_capacity_bytes)
    return EvalRun(results=results, runs=runs, samples=samples)


def warm_up(setup: EvalSetup, n: int) -> None:
    """`n` short requests per mode (not recorded), then an empty cache for the measured runs."""
    params = {"max_new_tokens": 8, "temperature": 0.0}
    for backend, cache in ((setup.uncached, False), (setup.cached, True)):
        for i in range(n):
            backend.generate(WARMUP_PROMPT.format(i=i), sampling_params=params, prefix_cache=cache)
    setup.cached.flush_cache()


def _run_mode(
    setup: EvalSetup,
    recorder: RecordingBackend,
    name: str,
    mode: str,
    repeat: int,
    config: EvalConfig,
    sampler: ResourceSampler,
) -> ModeRun:
    recorder.reset()
    if mode == "cached":
        setup.cached.flush_cache()  # every cached pass starts cold: hits come from the suite itself
    sampler.phase = f"{name}/{mode}"
    options = SuiteOptions(
        limit=config.limit_for(name),
        seed=config.seed,
        concurrency=config.concurrency,
        prefix_cache=mode == "cached",
        progress=False,
    )
    started = time.perf_counter()
    outcome, error = None, None
    try:
        outcome = run_suite(name, recorder, options)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one broken suite must not lose the others' measurements
        error = f"{type(exc).__name__}: {exc}"
    sampler.phase = "idle"
    return ModeRun(name, mode, repeat, recorder.calls, outcome, time.perf_counter() - started, error)


def _head_sweep(setup: EvalSetup, config: EvalConfig, sampler: ResourceSampler) -> dict[str, Any] | None:
    """Accuracy and TTFT vs head length (evals/suites/headlen.py), with the longdoc suite; None when off."""
    if "longdoc" not in config.suites or config.head_sweep_questions == 0:
        return None
    from evals.suites.headlen import SweepConfig, run_head_sweep

    sampler.phase = "head-length"
    try:
        return run_head_sweep(setup, SweepConfig(questions=config.head_sweep_questions))
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the sweep is an extra: its failure must not lose the suites
        return {"error": f"{type(exc).__name__}: {exc}", "rows": []}
    finally:
        sampler.phase = "idle"


def _keep_interrupted(runs: list[ModeRun], recorders: dict[str, RecordingBackend], phase: str) -> None:
    """The interrupted suite's calls so far (kept in calls.jsonl, left out of the metrics)."""
    name, _, mode = phase.partition("/")
    if mode in recorders:
        repeat = sum(1 for r in runs if r.suite == name and r.mode == mode)
        runs.append(ModeRun(name, mode, repeat, recorders[mode].calls, None, 0.0, "interrupted"))


# ---- results ------------------------------------------------------------------------------------
def build_results(
    setup: EvalSetup, config: EvalConfig, runs: Sequence[ModeRun], partial: bool, wall_s: float
) -> dict[str, Any]:
    suites = {}
    for name in config.suites:
        entry = suite_results([r for r in runs if r.suite == name])
        if entry is not None:
            suites[name] = entry
    partial = partial or any(r.outcome is None for r in runs) or len(suites) < len(config.suites)
    return {
        "backend": setup.backend_label,
        "model": setup.model,
        "machine": setup.machine,
        "suites": suites,
        "partial": partial,
        "uncached_method": setup.method,
        "config": {**asdict(config), "suite_limits": dict(config.suite_limits)},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "wall_s": wall_s,
    }


def suite_results(runs: Sequence[ModeRun]) -> dict[str, Any] | None:
    """One suite's entry from its mode runs (None when nothing of it ran)."""
    if not runs:
        return None
    done = {m: [r for r in runs if r.mode == m and r.outcome is not None] for m in MODES}
    comparison = _compare(done["cached"], done["uncached"])
    modes = {m: _mode(done[m], comparison) if done[m] else None for m in MODES}
    entry = suite_entry(modes["cached"], modes["uncached"], comparison)
    if done["cached"] and done["uncached"]:
        entry["answers_identical"] = _answers_identical(
            done["cached"][0].outcome, done["uncached"][0].outcome
        )
    errors = [f"{r.mode} #{r.repeat}: {r.error}" for r in runs if r.error]
    if errors:
        entry["errors"] = errors
    return entry


def _compare(cached: Sequence[ModeRun], uncached: Sequence[ModeRun]) -> Comparison | None:
    pairs = [(c, u) for c in cached for u in uncached if c.repeat == u.repeat]
    if not pairs:
        return None
    parts = [compare_outputs(c.calls, u.calls) for c, u in pairs]
    return Comparison(sum(p.compared for p in parts), sum(p.identical for p in parts))


def _mode(runs: Sequence[ModeRun], comparison: Comparison | None) -> dict[str, Any]:
    outcomes = [r.outcome for r in runs if r.outcome is not None]
    return mode_metrics(
        calls=[c for r in runs for c in r.calls],
        e2e_s=[o.e2e_s if o.e2e_s > 0 else r.wall_s for r, o in zip(runs, outcomes, strict=True)],
        accuracy=[o.accuracy for o in outcomes if o.accuracy is not None],
        identical=comparison.fraction if comparison else None,
        items=len(outcomes[0].items) if outcomes else 0,
    )


def _answers_identical(a: SuiteOutcome | None, b: SuiteOutcome | None) -> float | None:
    if a is None or b is None:
        return None
    answers = {i.item_id: i.answer for i in b.items}
    shared = [i for i in a.items if i.item_id in answers]
    return sum(i.answer == answers[i.item_id] for i in shared) / len(shared) if shared else None


# ---- make bench -----------------------------------------------------------------------------------
def reduced_eval(engine: Any, out_dir: str | Path, config: EvalConfig = REDUCED) -> dict[str, Any]:
    """The small configuration `make bench` runs on an already loaded engine: writes results.json,
    report.md and charts to `out_dir` and returns the results (the engine stays open)."""
    from evals.suites.report import write_outputs

    setup = embedded_setup(engine, config.concurrency)
    try:
        run = run_eval(setup, config)
    finally:
        setup.close()
    write_outputs(run, Path(out_dir))
    return run.results
