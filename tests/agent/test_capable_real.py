"""What a new user tries first, on the real bundled model: the README calculator and a pricing
task that tells the agent which tool to use. The tool must actually be called, with sensible
arguments, and the answer must be right."""

from __future__ import annotations

import pytest

from agent import Agent, tool
from runtime.backends import connect


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@tool(name="add")
def add_numbers(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def _calls(result) -> list[dict]:
    return [r.tool for r in result.trace if r.tool is not None]


@pytest.mark.slow
def test_readme_calculator_calls_add(engine):
    agent = Agent(
        connect(engine), system="You are a careful calculator.", tools=[add], tool_choice="required"
    )
    result = agent.run("What is 17 + 25?")
    calls = _calls(result)
    assert calls and calls[0]["name"] == "add" and calls[0]["arguments"] == {"a": 17, "b": 25}
    assert result.status == "answered" and "42" in (result.answer or "")


@pytest.mark.slow
def test_pricing_task_uses_the_tool_it_is_told_to(engine):
    agent = Agent(connect(engine), system="You are a shop assistant.", tools=[multiply, add_numbers])
    task = (
        "Price list: pen 2.50 dollars, notebook 4.00 dollars, stapler 6.75 dollars. "
        "Use the multiply tool to find the price of 7 notebooks."
    )
    result = agent.run(task)  # tool_choice "auto": the task names the tool, so it is called
    calls = _calls(result)
    assert calls and calls[0]["name"] == "multiply" and calls[0]["error"] is None
    assert sorted(calls[0]["arguments"].values()) == [4.0, 7.0]
    assert result.status == "answered" and "28" in (result.answer or "")
