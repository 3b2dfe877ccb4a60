"""`tasks.suites`: the contract the eval calls, each suite run on a scripted backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.backends.base import Backend, Completion
from runtime.errors import BackendError
from tasks.suites import SUITES, ItemOutcome, SuiteOptions, SuiteOutcome, run_suite


class RecordingBackend(Backend):
    """Answers every agent call with a fixed answer and records what each call asked for."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def generate(self, prompt=None, input_ids=None, sampling_params=None, **kwargs: Any) -> Completion:
        params = dict(sampling_params or {})
        self.calls.append({"params": params, **kwargs})
        text = json.dumps({"answer": "42"}) if "json_schema" in params else "Hello there."
        if params.get("max_new_tokens") == 0:
            text = ""
        return Completion(text, [], 100, 0, 3, "stop", 0.01, 0.02)

    def tokenize(self, text: str) -> list[int]:
        raise BackendError("no tokenizer")


def test_registry_and_options() -> None:
    assert set(SUITES) == {"longdoc", "reasoning", "chat"}
    with pytest.raises(ValueError, match="unknown suite"):
        run_suite("nope", RecordingBackend())
    with pytest.raises(ValueError):
        SuiteOptions(limit=0)
    with pytest.raises(ValueError):
        SuiteOptions(concurrency=0)


@pytest.mark.parametrize("name", ["longdoc", "reasoning", "chat"])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_each_suite_runs_through_the_given_backend(name: str, prefix_cache: bool) -> None:
    backend = RecordingBackend()
    outcome = run_suite(name, backend, SuiteOptions(limit=2, prefix_cache=prefix_cache))
    assert isinstance(outcome, SuiteOutcome) and outcome.suite == name and outcome.e2e_s >= 0
    assert len(outcome.items) == 2 and all(isinstance(i, ItemOutcome) for i in outcome.items)
    assert all(i.steps for i in outcome.items)
    assert backend.calls and all(c["params"]["temperature"] == 0.0 for c in backend.calls)
    assert all(c.get("prefix_cache", True) is prefix_cache for c in backend.calls)
    if name != "chat":
        assert all(i.correct is not None for i in outcome.items)
