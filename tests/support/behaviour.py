"""The agent behaviour suite: the same checks against any Backend (fake, embedded, HTTP, SGLang).

Each `check_*` takes a backend and asserts properties that hold whatever the model says:
valid constrained tool calls, prompts that only grow (no prefix breaks), cache fidelity,
rollback hitting the cache up to the checkpoint, a fork prefilled once. A test module
parametrizes them over backends (see test_behaviour.py; the real engines join there).
"""

from __future__ import annotations

import warnings

from agent import Agent, PrefixBreakWarning, RunResult, tool
from agent.layout import render_head_text
from agent.trace import common_prefix

SYSTEM = "You are a calculator agent. Call the add tool to add numbers, then answer with the result."


@tool(expected_s=0.01)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def _agent(backend, **kwargs) -> Agent:
    kwargs.setdefault("max_steps", 6)
    kwargs.setdefault("sampling", {"temperature": 0.0, "max_new_tokens": 48})
    return Agent(backend, system=kwargs.pop("system", SYSTEM), tools=[add, multiply], **kwargs)


def _no_breaks(result: RunResult) -> None:
    breaks = [(r.step, r.prefix_break) for r in result.trace if r.prefix_break is not None]
    assert not breaks, f"prefix breaks: {breaks}"


def check_tool_task(backend, min_fidelity: float = 0.95) -> RunResult:
    """A tool-using run: every action parses (constrained decoding), no breaks, fidelity high."""
    result = _agent(backend).run("What is 17 + 25?")
    assert result.trace, "no model call was made"
    assert result.status in ("answered", "max_steps"), result.status
    assert all(r.finish_reason != "error" for r in result.trace)
    parse_errors = [
        s.observation for s in result.steps if s.observation and s.observation.startswith("Error:")
    ]
    assert not parse_errors, f"invalid actions despite constrained decoding: {parse_errors}"
    _no_breaks(result)
    assert result.cache_fidelity >= min_fidelity, f"cache fidelity {result.cache_fidelity:.3f}"
    for record in result.trace[1:]:
        assert record.cached_tokens > 0, f"step {record.step} hit nothing"
    return result


def check_backtrack(backend, min_fidelity: float = 0.95) -> RunResult:
    """A verifier rejecting the first answer: rollback in the trace, retry hits up to the checkpoint."""
    seen: list[str] = []

    def reject_first(answer: str) -> tuple[bool, str]:
        seen.append(answer)
        return len(seen) > 1, "double-check the sum"

    # answers only (tool_choice "none"): the first step is an answer, so the rollback always runs
    agent = _agent(backend, verify=reject_first, max_steps=8, reflect=False, tool_choice="none")
    result = agent.run("What is 17 + 25?")
    kinds = [r.kind for r in result.trace]
    assert len(seen) >= 2, f"the verifier saw {len(seen)} answers: the backtrack was not exercised"
    assert "backtrack" in kinds, kinds
    _no_breaks(result)
    first = result.trace[0]
    for record in result.trace:
        if record.kind == "backtrack":
            # The retry's prompt is the checkpoint (head + task) + a note: the checkpoint must hit.
            assert record.cached_tokens >= first.prompt_tokens - 8, (
                record.cached_tokens,
                first.prompt_tokens,
            )
            assert record.cached_tokens >= min_fidelity * record.ideal_cached_tokens
    assert any(s.abandoned for s in result.steps)
    return result


def check_fork(backend, n: int = 4) -> list[RunResult]:
    """n branches from one prefix: prefilled once; each branch's first call hits all of it."""
    results = _agent(backend, max_steps=3).fork(n, "What is 17 + 25?")
    assert len(results) == n and [r.branch for r in results] == list(range(1, n + 1))
    prefill = results.prefill
    assert prefill is not None and prefill.kind == "fork"
    for result in results:
        first = result.trace[0]
        assert first.prompt_tokens == prefill.prompt_tokens
        # A cache recomputes the last prompt position, so len-1 is a full hit.
        assert first.cached_tokens >= prefill.prompt_tokens - 1, (first.cached_tokens, prefill.prompt_tokens)
        assert first.session_id == prefill.session_id
        _no_breaks(result)
    return results


def check_prefix_break_detected(backend) -> RunResult:
    """A timestamp in a dynamic system prompt breaks the prefix: detected at the exact offset."""
    clock = iter(range(1000, 1100))
    stamp = []

    def system() -> str:
        stamp.append(next(clock))
        return f"{SYSTEM} Current time: t{stamp[-1]}."

    # Rejecting every answer without backtracking forces a second call whatever the model says.
    agent = _agent(
        backend, system=system, max_steps=2, reflect=True, verify=lambda a: False, max_backtracks=0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = agent.run("What is 17 + 25?")
    assert len(result.trace) == 2, [r.finish_reason for r in result.trace]
    record = result.trace[1]
    assert record.prefix_break is not None, "timestamped head not detected"
    # The head is rendered for every prompt (and checkpoint): the last two renders are steps 0 and 1.
    heads = [render_head_text(f"{SYSTEM} Current time: t{s}.", [add, multiply], (), True) for s in stamp[-2:]]
    if record.prefix_break["unit"] == "chars":
        expected = common_prefix(heads[0], heads[1])
    else:
        expected = common_prefix(backend.tokenize(heads[0]), backend.tokenize(heads[1]))
    assert record.prefix_break["offset"] == expected, (record.prefix_break, expected)
    assert any(issubclass(w.category, PrefixBreakWarning) for w in caught)
    return result


ALL_CHECKS = (check_tool_task, check_backtrack, check_fork, check_prefix_break_detected)
