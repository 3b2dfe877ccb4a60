"""A tool-using task on the real default model: valid constrained calls, the right answer,
high cache fidelity and no prefix breaks."""

from __future__ import annotations

from agent import Agent, tool
from runtime.backends import connect

PRICES = {"apple": 3, "banana": 5, "cherry": 11}


@tool
def lookup_price(item: str) -> int:
    """Look up the price in dollars of one fruit in the shop's table.

    Args:
        item: fruit name, singular, lower case (apple, banana, cherry)
    """
    return PRICES[item]


def test_lookup_task_calls_the_tool_and_answers(engine, tmp_path):
    agent = Agent(
        connect(engine),
        system="You are a shop assistant. You do not know any prices: call lookup_price to get a price.",
        tools=[lookup_price],
        max_steps=5,
        tool_choice="required",
        sampling={"temperature": 0.0, "max_new_tokens": 48},
        trace_path=tmp_path / "trace.jsonl",
    )
    result = agent.run("How much does a banana cost?")
    assert result.status == "answered", result.status
    assert "5" in result.answer
    calls = [r.tool for r in result.trace if r.tool is not None]
    assert calls and all(c["name"] == "lookup_price" and c["error"] is None for c in calls)
    assert calls[0]["arguments"] == {"item": "banana"}
    assert all(r.prefix_break is None for r in result.trace)
    assert result.cache_fidelity >= 0.95
    for record in result.trace[1:]:
        assert record.cached_tokens >= record.ideal_cached_tokens - 1  # the last output token is recomputed
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert len(lines) == len(result.trace)
