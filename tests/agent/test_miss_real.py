"""Miss attribution on the real engine through the SDK (issue 19): a byte-stable run misses only
`new` and `last_token`; a system prompt that changes its second line is a `prompt_change` whose
break names that line."""

from __future__ import annotations

import itertools

import pytest

from agent import Agent, tool
from runtime.backends import connect

pytestmark = pytest.mark.slow


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _check_sums(records) -> None:
    for r in records:
        assert r.miss is not None
        assert sum(r.miss.values()) == r.prompt_tokens - r.cached_tokens, r


def test_byte_stable_run_misses_only_new_and_last_token(engine) -> None:
    agent = Agent(
        connect(engine),
        system="You add numbers with the add tool.",
        tools=[add],
        tool_choice="required",
        max_steps=3,
        reflect=False,
        sampling={"max_new_tokens": 24},
        cache_salt="miss-real-1",
    )
    result = agent.run("What is 2 + 3?")
    assert len(result.trace) >= 2
    _check_sums(result.trace)
    for r in result.trace:
        assert set(r.miss) <= {"new", "last_token"}, r.miss
    assert all(r.miss.get("last_token", 0) <= 1 for r in result.trace)


def test_changed_system_line_is_a_prompt_change(engine) -> None:
    counter = itertools.count()
    system = lambda: f"You add numbers.\nRequest number {next(counter)}.\nUse the add tool."  # noqa: E731
    agent = Agent(
        connect(engine),
        system=system,
        tools=[add],
        tool_choice="required",
        max_steps=2,
        reflect=False,
        sampling={"max_new_tokens": 24},
        cache_salt="miss-real-2",
    )
    with pytest.warns(UserWarning):
        result = agent.run("What is 4 + 5?")
    _check_sums(result.trace)
    second = result.trace[1]
    assert second.prefix_break is not None and second.prefix_break["piece"] == "system message line 2"
    assert second.cached_tokens == second.prefix_break["offset"]
    assert second.miss.get("prompt_change", 0) > 0 and "unexplained" not in second.miss


def test_a_changed_system_line_between_runs_is_a_prompt_change(engine) -> None:
    """Issue 35: the second run of one session changes the system line before a document. The
    session's last prompt is the reference, so the lost document is `prompt_change` (with the
    changing span), not `new`; a third run that only asks another question has no break."""
    doc = " ".join(f"Item {i} weighs {i * 7 % 13} kilograms." for i in range(60))
    system = {"text": "Today is Monday. You add numbers with the add tool."}
    agent = Agent(
        connect(engine),
        system=lambda: system["text"],
        tools=[add],
        documents=[("inventory", doc)],
        tool_choice="required",
        max_steps=1,
        reflect=False,
        sampling={"max_new_tokens": 16},
        session_id="cross-run",
        cache_salt="miss-real-3",
    )
    agent.run("What is 2 + 3?")
    system["text"] = "Today is Tuesday. You add numbers with the add tool."
    with pytest.warns(UserWarning):
        second = agent.run("What is 4 + 5?").trace[0]
    _check_sums([second])
    brk = second.prefix_break
    assert brk is not None and brk["reference"] == "session" and brk["piece"] == "system message line 1"
    assert "Monday" in brk["changed"]["expected"] and "Tuesday" in brk["changed"]["got"]
    assert brk["changed"]["realigned"] > 300  # the tool list and the whole document
    assert second.miss["prompt_change"] >= brk["changed"]["realigned"]
    assert second.miss.get("new", 0) < 40  # only the new question and the turn's close
    third = agent.run("What is 6 + 7?").trace[0]
    _check_sums([third])
    assert third.prefix_break is None and "prompt_change" not in third.miss
