"""Worked examples: whole demonstrated runs (task, tool calls with results, answer) in the head.

They are rendered as real ChatML turns, in exactly the format of a live run (the same templates,
the same compact JSON the grammar produces), after the system message. The head stays a pure
function of the agent's configuration, so every example is prefilled once and then served by the
prefix cache: a long many-shot head costs nothing per question after the first call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent import prompts


@dataclass(frozen=True, slots=True)
class ExampleCall:
    """One demonstrated tool call and the result the tool returned."""

    tool: str
    arguments: Mapping[str, object]
    result: str


@dataclass(frozen=True, slots=True)
class Example:
    """A demonstrated run: `task`, then `calls` in order, then the final `answer`.

    `calls` may be given as (tool, arguments, result) tuples.
    """

    task: str
    answer: str
    calls: tuple[ExampleCall, ...] = field(default=())

    def __post_init__(self) -> None:
        calls = tuple(c if isinstance(c, ExampleCall) else ExampleCall(*c) for c in self.calls)
        object.__setattr__(self, "calls", calls)
        if not self.task.strip() or not self.answer.strip():
            raise ValueError("an example needs a task and an answer")

    @property
    def tools(self) -> set[str]:
        return {c.tool for c in self.calls}


def _compact(value: object) -> str:
    # The grammar emits compact JSON in schema order: the example must look exactly like that.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def call_json(tool: str, arguments: Mapping[str, object]) -> str:
    return _compact({"tool": tool, "arguments": dict(arguments)})


def answer_json(answer: str) -> str:
    return _compact({"answer": answer})


def render_example(example: Example) -> str:
    """The example's ChatML turns (user task, assistant call, user observation, ..., answer)."""
    turns = [prompts.MESSAGE.format(role="user", content=prompts.TASK.format(task=example.task))]
    for index, call in enumerate(example.calls):
        turns.append(prompts.MESSAGE.format(role="assistant", content=call_json(call.tool, call.arguments)))
        observation = prompts.OBSERVATION.format(call_id=f"call_{index}", content=call.result)
        turns.append(prompts.MESSAGE.format(role="user", content=observation))
    turns.append(prompts.MESSAGE.format(role="assistant", content=answer_json(example.answer)))
    return "".join(turns)


def render_examples(examples: Sequence[Example]) -> str:
    return "".join(render_example(e) for e in examples)


#: What an agent with tools but no worked examples of its own (or on its tools) shows the model:
#: whole runs of the protocol (call, result, then the answer at once), with tools the agent does
#: not have, so they teach the moves and never a fact (the grammar only lets the model call the
#: agent's own tools). Measured on the bundled 135M model: without them it calls `add` again on its
#: own result (17+25, 42+25, 67+25, ...) until max_steps; with them it answers 42 after one call.
PROTOCOL_EXAMPLES: tuple[Example, ...] = (
    Example(
        "What is the weather in Oslo?",
        "Rainy, 8 C",
        (ExampleCall("get_weather", {"city": "Oslo"}, "Rainy, 8 C"),),
    ),
    Example(
        "Menu: tea 2.00 dollars, cake 3.50 dollars, soup 5.00 dollars. Use the times tool to find the price of 4 cakes.",
        "14.0",
        (ExampleCall("times", {"x": 4, "y": 3.5}, "14.0"),),
    ),
)


def default_examples(tool_names: Sequence[str]) -> tuple[Example, ...]:
    """The protocol examples whose tools the agent does not have (a same-named tool of the agent's
    own could take other arguments: its demonstration would teach a bad call)."""
    names = set(tool_names)
    return tuple(e for e in PROTOCOL_EXAMPLES if not e.tools & names) if names else ()


def check_examples(examples: Sequence[Example], tool_names: Sequence[str]) -> None:
    """ValueError when an example calls a tool the agent does not have (it would teach a bad call)."""
    for example in examples:
        unknown = sorted(example.tools - set(tool_names))
        if unknown:
            raise ValueError(f"example {example.task[:40]!r} calls unknown tool(s) {unknown}")
