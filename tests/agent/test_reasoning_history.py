"""The SDK's two reasoning-history modes: a thinking model's earlier turns kept as generated
(every prompt extends the last) or dropped as Qwen3's template drops them (the trace names it)."""

from __future__ import annotations

import pytest

from agent import Agent, PrefixBreakWarning
from tests.support.behaviour import SYSTEM, add
from tests.support.fake_backend import FakeBackend, FakeCall, arithmetic_model


def thinking_model(call: FakeCall) -> str:
    return "<think>first add, then answer</think>" + arithmetic_model(call)


@pytest.mark.parametrize("mode", ["preserve", "template"])
def test_thinking_turns_in_each_mode(mode):
    backend = FakeBackend(thinking_model)
    agent = Agent(backend, system=SYSTEM, tools=[add], reflect=False, reasoning_history=mode)
    if mode == "template":  # the SDK warns of every prefix break, this one included
        with pytest.warns(PrefixBreakWarning, match="prefix break"):
            result = agent.run("What is 17 + 25?")
    else:
        result = agent.run("What is 17 + 25?")
    assert result.status == "answered" and result.answer == "42"
    second = result.trace[1]
    assert sum(second.miss.values()) == second.prompt_tokens - second.cached_tokens
    if mode == "preserve":
        assert second.prefix_break is None and second.cached_tokens > result.trace[0].prompt_tokens
        assert "<think>" in backend.calls[1].prompt
        return
    assert "<think>" not in backend.calls[1].prompt  # turn 1's block dropped
    assert second.miss.get("template_rewrite", 0) > 0 and "prompt_change" not in second.miss
    assert second.prefix_break["cause"] == "template_rewrite"
    assert second.prefix_break["rewrites"][0]["dropped"] == "<think>first add, then answer</think>"


def test_default_is_preserve():
    assert (
        Agent(FakeBackend(thinking_model), system=SYSTEM, tools=[add]).config.reasoning_history == "preserve"
    )
