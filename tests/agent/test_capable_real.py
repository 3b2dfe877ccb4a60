"""What a new user tries first, on the real bundled model: the README calculator and a pricing
task that tells the agent which tool to use. The tool is actually called (the grammar forces it),
with numbers taken from the task, and the run then answers with the tool's result: the agent's
built-in protocol examples (agent/examples.py) show the model call -> result -> answer."""

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


PRICING = (
    "Price list: pen 2.50 dollars, notebook 4.00 dollars, stapler 6.75 dollars. "
    "Use the multiply tool to find the price of 7 notebooks."
)


@pytest.mark.slow
def test_readme_calculator_calls_add_with_the_tasks_numbers(engine):
    agent = Agent(
        connect(engine),
        system="You are a careful calculator.",
        tools=[add],
        tool_choice="required",
        max_steps=3,
        sampling={"max_new_tokens": 48},
    )
    result = agent.run("What is 17 + 25?")
    calls = _calls(result)
    assert calls and calls[0] == {
        "name": "add",
        "arguments": {"a": 17, "b": 25},
        "result": "42",
        "error": None,
    }


@pytest.mark.slow
def test_pricing_task_calls_the_tool_it_names_with_listed_numbers(engine):
    agent = Agent(
        connect(engine),
        system="You are a shop assistant.",
        tools=[multiply, add_numbers],
        max_steps=3,
        sampling={"max_new_tokens": 48},
    )
    result = agent.run(PRICING)  # tool_choice "auto": the task names the tool, so it is called first
    calls = _calls(result)
    assert calls and calls[0]["name"] == "multiply" and calls[0]["error"] is None
    assert set(calls[0]["arguments"].values()) <= {2.5, 4, 6.75, 7}  # grounded: no invented numbers


@pytest.mark.slow
def test_calculator_and_pricing_answers_are_right(engine):
    calc = Agent(
        connect(engine),
        system="You are a careful calculator.",
        tools=[add],
        tool_choice="required",
        max_steps=4,
        sampling={"max_new_tokens": 48},
    ).run("What is 17 + 25?")
    assert calc.status == "answered" and "42" in (calc.answer or "")
    shop = Agent(
        connect(engine),
        system="You are a shop assistant.",
        tools=[multiply, add_numbers],
        max_steps=4,
        sampling={"max_new_tokens": 48},
    ).run(PRICING)
    assert sorted(_calls(shop)[0]["arguments"].values()) == [4.0, 7.0] and "28" in (shop.answer or "")
