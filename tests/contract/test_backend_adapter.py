"""`Backend.complete` is what the agent calls: a backend written against the keyword form
(`generate` only) is run through it with every field carried over, and nothing is run unsalted."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.backends.base import Backend, Completion
from runtime.engine.generation import GenerationRequest
from runtime.errors import BackendError


class KeywordOnly(Backend):
    name = "keyword-only"

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def generate(self, prompt=None, input_ids=None, sampling_params=None, **fields: Any) -> Completion:
        self.seen.append((prompt, input_ids, sampling_params, fields))
        return Completion("ok", [], 3, 1, 1, "stop", 0.0, 0.0)


def test_complete_runs_a_generate_only_backend_with_every_field() -> None:
    backend = KeywordOnly()
    request = GenerationRequest.of(
        None,
        [1, 2, 3],
        {"max_new_tokens": 4},
        session_id="s",
        cache_salt="tenant",
        priority=2,
        prefix_cache=False,
        rid="r-1",
    )
    assert backend.complete(request).text == "ok"
    assert backend.seen == [
        (
            None,
            [1, 2, 3],
            {"max_new_tokens": 4},
            {"session_id": "s", "cache_salt": "tenant", "priority": 2, "prefix_cache": False, "rid": "r-1"},
        )
    ]


def test_a_salt_with_an_extra_key_is_refused_not_dropped() -> None:
    request = GenerationRequest(prompt="hi", cache_salt=("tenant", "extra"))
    with pytest.raises(BackendError, match="cache_salt"):
        KeywordOnly().complete(request)


def test_a_backend_with_neither_form_says_so() -> None:
    with pytest.raises(NotImplementedError, match="neither complete nor generate"):
        Backend().complete(GenerationRequest(prompt="hi"))
