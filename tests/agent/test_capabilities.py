"""The agent reads what a backend declares it can do (`can_tokenize`, `supports_input_ids`)
instead of probing with a call and catching the error (issue 18)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent import Agent
from runtime.backends.base import WrappedBackend
from runtime.errors import BackendError
from tests.support.behaviour import SYSTEM, add
from tests.support.fake_backend import FakeBackend


@dataclass
class CountingBackend(FakeBackend):
    tokenize_calls: int = 0

    def tokenize(self, text: str) -> list[int]:
        self.tokenize_calls += 1
        return super().tokenize(text)


def test_a_backend_that_declares_no_tokenizer_is_never_asked_to_tokenize():
    backend = CountingBackend(['{"answer":"5"}'], can_tokenize=False, supports_input_ids=False)
    result = Agent(backend, system=SYSTEM, tools=[add]).run("What is 2 + 3?")
    assert result.answer == "5"
    assert backend.tokenize_calls == 0


def test_a_declared_tokenizer_is_used():
    backend = CountingBackend(['{"answer":"5"}'])
    Agent(backend, system=SYSTEM, tools=[add]).run("What is 2 + 3?")
    assert backend.tokenize_calls > 0


def test_a_tokenizer_that_fails_after_declaring_itself_is_an_error_not_a_silent_fallback():
    class Broken(FakeBackend):
        def tokenize(self, text: str) -> list[int]:
            raise BackendError("tokenizer crashed")

    with pytest.raises(BackendError, match="tokenizer crashed"):
        Agent(Broken(['{"answer":"5"}']), system=SYSTEM, tools=[add]).run("What is 2 + 3?")


def test_wrapped_backends_declare_what_they_wrap():
    assert WrappedBackend(FakeBackend([], can_tokenize=False)).can_tokenize is False
    assert WrappedBackend(FakeBackend([])).can_tokenize is True
