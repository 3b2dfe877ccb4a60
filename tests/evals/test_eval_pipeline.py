"""The eval pipeline: metrics and regression rules on synthetic records, the loop and CLI on a
function-backed fake backend, and the whole pipeline on the real engine with a tiny suite."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from evals.suites import cli
from evals.suites.backends import EvalSetup
from evals.suites.metrics import (
    Comparison,
    RegressionRules,
    compare_outputs,
    find_regressions,
    mode_metrics,
    percentile,
    suite_entry,
)
from evals.suites.recording import CallRecord, RecordingBackend
from evals.suites.report import markdown_section, write_outputs
from evals.suites.run import EvalConfig, run_eval
from runtime.backends.base import Backend
from tasks import suites
from tasks.suites import ItemOutcome, SuiteOptions, SuiteOutcome
from tests.support.fake_backend import ReplyBackend

MODE_KEYS = {
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "hit_rate",
    "prefill_tokens_computed",
    "ttft_p50_s",
    "ttft_p95_s",
    "e2e_s",
    "outputs_identical",
    "accuracy",
}


def call(
    i: int,
    key: str,
    out: list[int],
    prompt: int = 100,
    cached: int = 0,
    ttft: float = 0.1,
    error: str | None = None,
) -> CallRecord:
    return CallRecord(
        index=i,
        prompt_key=key,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=len(out),
        ttft_s=ttft,
        latency_s=ttft + 0.5,
        output_ids=out,
        text="",
        finish_reason="stop",
        session_id=None,
        started_s=0.0,
        error=error,
    )


# ---- pure metrics ---------------------------------------------------------------------------------
def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)


def test_compare_outputs_pairs_by_prompt_and_counts_divergence() -> None:
    a = [call(0, "p1", [1, 2]), call(1, "p2", [3]), call(2, "p2", [4]), call(3, "p3", [5])]
    same_other_order = [call(0, "p2", [3]), call(1, "p1", [1, 2]), call(2, "p2", [4]), call(3, "p3", [5])]
    assert compare_outputs(a, same_other_order) == Comparison(4, 4)
    diverged = [
        call(0, "p1", [1, 2]),
        call(1, "p2", [9]),
        call(2, "pX", [4]),
    ]  # p2 differs, then p3 never happens
    cmp = compare_outputs(a, diverged)
    assert cmp == Comparison(4, 1) and cmp.fraction == 0.25
    failed = [call(0, "p1", [1, 2]), call(1, "p2", [], error="BackendError: boom")]
    assert compare_outputs(failed[:1], failed) == Comparison(1, 1)  # failed calls are left out


def test_mode_metrics_and_speedups() -> None:
    cached = [
        call(0, "a", [1], prompt=1000, cached=0, ttft=2.0),
        call(1, "b", [1], prompt=1100, cached=999, ttft=0.1),
        call(2, "c", [1], prompt=1200, cached=1099, ttft=0.2),
        call(3, "d", [], error="x"),
    ]
    uncached = [
        call(i, k, [1], prompt=p, ttft=t)
        for i, (k, p, t) in enumerate([("a", 1000, 2.0), ("b", 1100, 2.2), ("c", 1200, 2.4)])
    ]
    c = mode_metrics(cached, e2e_s=[10.0, 12.0, 11.0], accuracy=[0.5, 1.0], identical=1.0, items=2)
    u = mode_metrics(uncached, e2e_s=[30.0], accuracy=[0.5], identical=1.0, items=2)
    assert c.keys() >= MODE_KEYS
    assert (c["requests"], c["failed_requests"], c["prompt_tokens"], c["cached_tokens"]) == (3, 1, 3300, 2098)
    assert c["prefill_tokens_computed"] == 3300 - 2098 and c["hit_rate"] == pytest.approx(2098 / 3300)
    assert c["ttft_p50_s"] == 0.2 and c["e2e_s"] == 11.0 and c["accuracy"] == 0.75
    entry = suite_entry(c, u, Comparison(3, 3))
    assert entry["speedup_ttft_p50"] == pytest.approx(2.2 / 0.2) and entry["speedup_e2e"] == pytest.approx(
        30 / 11
    )
    assert suite_entry(c, None, None)["speedup_e2e"] is None


def test_regressions_flag_speedup_identity_and_accuracy_drops() -> None:
    def results(ttft: float, e2e: float, identical: float, acc: float | None) -> dict[str, Any]:
        mode = {"outputs_identical": identical, "accuracy": acc, "hit_rate": 0.9}
        return {
            "suites": {
                "longdoc": {"cached": mode, "uncached": mode, "speedup_ttft_p50": ttft, "speedup_e2e": e2e}
            }
        }

    base = results(12.0, 2.5, 1.0, 0.5)
    assert find_regressions(results(11.0, 2.4, 1.0, 0.5), base) == []  # within 10 %
    found = find_regressions(results(9.0, 2.0, 0.9, 0.25), base)
    assert {r.metric for r in found} == {"speedup_ttft_p50", "speedup_e2e", "outputs_identical", "accuracy"}
    assert find_regressions(results(9.0, 2.5, 1.0, 0.5), base, RegressionRules(speedup_drop=0.5)) == []
    assert find_regressions(results(1.0, 1.0, 0.0, 0.0), {"suites": {}}) == []  # suite not in baseline


# ---- the loop on a fake backend ----------------------------------------------------------------------
def fake_backend() -> ReplyBackend:
    """The answer is a function of the prompt; a prefix cache over the prompts' text (a prompt
    sharing a seen one's document is cached up to it) when the request reads it, and cache hits
    are faster (TTFT grows with the tokens computed)."""
    return ReplyBackend(lambda prompt, _params: f"answer {len(prompt)}", cache=True, prefill_s_per_token=1e-3)


def fake_suite(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    doc = "doc " * 200
    items = []
    for i, q in enumerate(["what is one?", "what is two?", "what is three?"][: options.limit]):
        out = backend.generate(prompt=f"{doc}? {q}", sampling_params={"temperature": 0.0})
        items.append(
            ItemOutcome(
                f"q{i}",
                out.text,
                i % 2 == 0,
                "ok",
                [
                    {
                        "ttft_s": out.ttft_s,
                        "kind": "qa",
                        "prompt_tokens": out.prompt_tokens,
                        "cached_tokens": out.cached_tokens,
                    }
                ],
            )
        )
    return SuiteOutcome("fake", items, e2e_s=1.0 if options.prefix_cache else 3.0)


def fake_setup() -> EvalSetup:
    backend = fake_backend()
    return EvalSetup(
        backend_label="fake",
        model="fake-model",
        machine="test",
        method="fake flag",
        cached=backend,
        uncached=backend,
    )


def test_recording_backend_forces_prefix_cache_and_flushes() -> None:
    inner = fake_backend()
    rec = RecordingBackend(inner, prefix_cache=False, flush_each=True)
    rec.generate("a b c? q", prefix_cache=True)
    rec.generate("a b c? q", prefix_cache=True)
    assert [c["prefix_cache"] for c in inner.calls] == [False, False] and inner.flushes == 2
    assert [c.cached_tokens for c in rec.calls] == [0, 0] and rec.calls[1].index == 1
    rec.reset()
    assert rec.calls == []


def test_run_eval_on_fake_backend_and_cli_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(suites.SUITES, "chat", fake_suite)
    setup = fake_setup()
    run = run_eval(setup, EvalConfig(suites=("chat",), warmup=1, repeats=2, sample_interval_s=0.05))
    entry = run.results["suites"]["chat"]
    assert entry["cached"]["requests"] == entry["uncached"]["requests"] == 6  # 3 items x 2 repeats
    assert entry["uncached"]["cached_tokens"] == 0 < entry["cached"]["cached_tokens"]
    assert entry["cached"]["outputs_identical"] == 1.0 and entry["speedup_e2e"] == 3.0
    assert run.results["partial"] is False
    # the CLI over the same fake: a baseline with better numbers is a regression (exit 1 when asked)
    baseline = tmp_path / "base.json"
    better = json.loads(json.dumps(run.results))
    better["suites"]["chat"]["speedup_e2e"] = 10.0
    baseline.write_text(json.dumps(better))
    monkeypatch.setattr(cli, "open_setup", lambda *a, **k: fake_setup())
    argv = ["--suite", "chat", "--warmup", "0", "--out", str(tmp_path / "o"), "--baseline", str(baseline)]
    assert cli.main(argv) == 0
    assert cli.main([*argv, "--fail-on-regression"]) == 1
    report = (tmp_path / "o" / "report.md").read_text()
    assert "REGRESSION" in report and "speedup_e2e" in report


def test_ctrl_c_keeps_what_was_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
        if options.prefix_cache:
            backend.generate(prompt="doc? q", sampling_params={})
            raise KeyboardInterrupt
        return fake_suite(backend, options)

    monkeypatch.setitem(suites.SUITES, "longdoc", fake_suite)
    monkeypatch.setitem(suites.SUITES, "reasoning", interrupted)
    run = run_eval(fake_setup(), EvalConfig(suites=("longdoc", "reasoning", "chat"), warmup=0))
    res = run.results
    assert res["partial"] and res["interrupted"] and set(res["suites"]) == {"longdoc", "reasoning"}
    assert res["suites"]["longdoc"]["speedup_e2e"] == 3.0
    assert res["suites"]["reasoning"]["cached"] is None and res["suites"]["reasoning"]["speedup_e2e"] is None
    write_outputs(run, tmp_path)
    assert "Partial run" in (tmp_path / "report.md").read_text()
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    assert any(json.loads(ln)["suite"] == "reasoning" and json.loads(ln)["mode"] == "cached" for ln in lines)


# ---- the real engine ------------------------------------------------------------------------------------
DOC = (
    "Notes from the harbour office. " * 6
    + "The secret code for the east gate is 4172. "
    + "Boats arrive in the morning and leave at dusk. " * 8
)
QUESTIONS = [
    ("q1", "What is the secret code for the east gate?", "4172"),
    ("q2", "When do boats leave?", "dusk"),
]


def tiny_suite(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    """Two questions about a short document, two steps each (question, then a follow-up that
    extends the first prompt), through `backend.generate` with chat-formatted token ids."""
    from agent.trace import StepRecord

    started, items = time.perf_counter(), []
    head = f"<|im_start|>system\nAnswer from the document.\n\n{DOC}<|im_end|>\n"
    for item_id, question, gold in QUESTIONS[: options.limit]:
        prompt, steps = head + f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", []
        for step in range(2):
            out = backend.generate(
                input_ids=backend.tokenize(prompt), sampling_params={"max_new_tokens": 8, "temperature": 0.0}
            )
            steps.append(
                StepRecord(
                    run_id=item_id,
                    session_id=item_id,
                    branch=0,
                    step=step,
                    kind="qa",
                    prompt_tokens=out.prompt_tokens,
                    cached_tokens=out.cached_tokens,
                    ideal_cached_tokens=0,
                    completion_tokens=out.completion_tokens,
                    ttft_s=out.ttft_s,
                    latency_s=out.latency_s,
                    finish_reason=out.finish_reason,
                    prefix_break=None,
                    tool=None,
                )
            )
            prompt += (
                out.text + "<|im_end|>\n<|im_start|>user\nOne word only.<|im_end|>\n<|im_start|>assistant\n"
            )
        items.append(ItemOutcome(item_id, out.text, gold in out.text, "ok", steps))
    return SuiteOutcome("tiny", items, e2e_s=time.perf_counter() - started)


@pytest.mark.slow
def test_pipeline_on_real_engine(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evals.suites.backends import embedded_setup

    monkeypatch.setitem(suites.SUITES, "tiny", tiny_suite)
    setup = embedded_setup(engine)
    try:
        run = run_eval(setup, EvalConfig(suites=("tiny",), warmup=1, sample_interval_s=0.2))
    finally:
        setup.close()
    write_outputs(run, tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    assert {"backend", "model", "machine", "suites"} <= res.keys() and res["backend"] == "embedded"
    entry = res["suites"]["tiny"]
    assert {"cached", "uncached", "speedup_ttft_p50", "speedup_e2e"} <= entry.keys()
    cached, uncached = entry["cached"], entry["uncached"]
    assert cached.keys() >= MODE_KEYS and uncached.keys() >= MODE_KEYS
    assert cached["requests"] == uncached["requests"] == 4
    assert uncached["cached_tokens"] == 0 and uncached["prefill_tokens_computed"] == uncached["prompt_tokens"]
    assert cached["cached_tokens"] > 0.5 * cached["prompt_tokens"]
    assert cached["outputs_identical"] == 1.0 == uncached["outputs_identical"]
    assert entry["speedup_ttft_p50"] > 1.0 and res["partial"] is False
    assert res["resources"]["pool_capacity_bytes"] == engine.get_cache_stats()["pool_capacity_bytes"]
    for name in ("report.md", "ttft_per_step.png", "hit_rate_per_step.png", "speedup.png", "memory.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "tiny" in markdown_section(res)
    engine.check_integrity()
