"""`tasks.suites`: the contract the eval calls, each suite run on a scripted backend."""

from __future__ import annotations

import json

import pytest

from tasks.suites import SUITES, ItemOutcome, SuiteOptions, SuiteOutcome, run_suite
from tests.support.fake_backend import ReplyBackend


def recording() -> ReplyBackend:
    """Answers every agent call with a fixed answer and records what each call asked for."""
    return ReplyBackend(
        lambda _prompt, params: json.dumps({"answer": "42"}) if "json_schema" in params else "Hello there."
    )


def test_registry_and_options() -> None:
    assert set(SUITES) == {"longdoc", "reasoning", "chat"}
    with pytest.raises(ValueError, match="unknown suite"):
        run_suite("nope", recording())
    with pytest.raises(ValueError):
        SuiteOptions(limit=0)
    with pytest.raises(ValueError):
        SuiteOptions(concurrency=0)


@pytest.mark.parametrize("name", ["longdoc", "reasoning", "chat"])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_each_suite_runs_through_the_given_backend(name: str, prefix_cache: bool) -> None:
    backend = recording()
    outcome = run_suite(name, backend, SuiteOptions(limit=2, prefix_cache=prefix_cache))
    assert isinstance(outcome, SuiteOutcome) and outcome.suite == name and outcome.e2e_s >= 0
    assert len(outcome.items) == 2 and all(isinstance(i, ItemOutcome) for i in outcome.items)
    assert all(i.steps for i in outcome.items)
    assert backend.calls and all(c["params"]["temperature"] == 0.0 for c in backend.calls)
    assert all(c.get("prefix_cache", True) is prefix_cache for c in backend.calls)
    if name != "chat":
        assert all(i.correct is not None for i in outcome.items)
