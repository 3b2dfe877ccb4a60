"""The action protocol: the JSON schema that constrains the model's turn, and its parser."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.constraints import forbidden_names, ground_numbers, guard_arguments
from agent.errors import ParseError
from agent.tools import Tool, canonical_json

ActionKind = Literal["tool", "answer", "dead_end", "thought"]


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    text: str | None = None  # answer / dead-end reason / thought
    tool: str | None = None
    arguments: dict[str, object] | None = None


def _object(properties: dict[str, object]) -> dict[str, object]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def action_schema(
    tools: Sequence[Tool],
    dead_end: bool = False,
    tools_only: bool = False,
    answer_only: bool = False,
    *,
    allowed: Sequence[str] | None = None,
    answer: dict[str, object] | None = None,
    numbers: Sequence[int | float] | None = None,
    arguments: Mapping[str, dict[str, object]] | None = None,
) -> str:
    """anyOf one object per tool ({"tool": const, "arguments": its schema}), answer, dead end.

    The branches are disjoint by their required keys, so anyOf is as strict as oneOf and is
    what every grammar backend (llguidance, xgrammar, outlines) supports. Keys are NOT sorted:
    grammar engines emit properties in schema order, and "tool" must come before "arguments"
    (and arguments in signature order). The schema is a sampling parameter, not prompt text.

    `allowed`: the tool names that may be called (default all); `tools_only`: no answer branch;
    `answer_only`: no tool branch; `answer`: the answer string's schema (default any string);
    `arguments`: per tool name, an arguments schema that replaces the tool's own for this call
    (a custom policy's narrowing; it must accept a subset of what the tool accepts).
    Free-text string arguments may not repeat a tool's name or be empty (`guard_arguments`);
    with `numbers`, free numeric arguments take one of them (`ground_numbers`).
    """
    names = [t.name for t in tools]
    forbidden = forbidden_names(names)
    narrowed = arguments or {}
    branches = [
        _object(
            {
                "tool": {"const": t.name},
                "arguments": ground_numbers(
                    guard_arguments(narrowed.get(t.name) or t.parameters_schema(), forbidden), numbers or ()
                ),
            }
        )
        for t in sorted(tools, key=lambda t: t.name)
        if not answer_only and (allowed is None or t.name in allowed)
    ]
    if tools_only and branches:
        return _ordered_json({"anyOf": branches})
    branches.append(_object({"answer": answer or {"type": "string"}}))
    if dead_end:
        branches.append(_object({"dead_end": {"type": "string"}}))
    return _ordered_json({"anyOf": branches})


def thought_schema() -> str:
    return _ordered_json(_object({"thought": {"type": "string"}}))


def _ordered_json(value: object) -> str:
    """Deterministic (built in a fixed order), compact, key order preserved."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def parse_action(text: str) -> Action:
    """Raises ParseError when `text` is not exactly one JSON object of a known action shape."""
    body = text.strip().removesuffix("<|im_end|>")
    if body.startswith("<think>") and "</think>" in body:  # a reasoning model's thinking first
        body = body.split("</think>", 1)[1]
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON: {exc.msg} at char {exc.pos}") from None
    if not isinstance(data, dict):
        raise ParseError("expected a JSON object")
    if "tool" in data:
        name, arguments = data.get("tool"), data.get("arguments", {})
        if not isinstance(name, str):
            raise ParseError('"tool" must be a string')
        return Action("tool", tool=name, arguments=arguments)
    for key, kind in (("answer", "answer"), ("dead_end", "dead_end"), ("thought", "thought")):
        if key in data:
            value = data[key]
            return Action(kind, text=value if isinstance(value, str) else canonical_json(value))  # type: ignore[arg-type]
    raise ParseError('expected "tool", "answer" or "dead_end"')
