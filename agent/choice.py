"""`tool_choice`: which actions the grammar allows, per model call.

Values (OpenAI's, plus a plain tool name as shorthand for the named form):
- "auto": the model picks a tool call or an answer. When the task itself tells the agent to use
  one of its tools ("Use the multiply tool", "call lookup_price"), the first action must call
  one of the tools the task names, as if `tool_choice` named it for this run.
- "required": a branch's first action must call some tool (later ones may answer).
- "none": no tool calls; the model answers directly.
- a tool's name: a branch's first action must call that tool.

The constraint is enforced by the action grammar, never by asking nicely.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

KEYWORDS = ("auto", "required", "none")


def check_tool_choice(value: str, tool_names: Collection[str]) -> str:
    """`value` itself when valid for these tools; ValueError naming the choices otherwise."""
    if value in KEYWORDS and (value != "required" or tool_names):
        return value
    if value in tool_names:
        return value
    if value == "required":
        raise ValueError("tool_choice='required' needs at least one tool")
    raise ValueError(
        f"tool_choice must be one of {list(KEYWORDS)} or a tool name {sorted(tool_names)}, got {value!r}"
    )


def _spellings(name: str) -> str:
    return "|".join(re.escape(v) for v in sorted({name, name.replace("_", " ")}))


def named_in_task(task: str, tool_names: Collection[str]) -> tuple[str, ...]:
    """The tools a task tells the agent to use ("use the add tool", "call `add`"), sorted; () if none.

    Only an explicit instruction counts: a verb (use / call / run / with) right before a tool's
    name, optionally with "the" and quotes. Once one tool is named so, every tool the task names
    counts ("use add or multiply").
    """
    quote = "[`'\"]?"
    verb = r"\b(?:use|using|call|calling|run|with)\s+(?:the\s+)?"
    if not any(re.search(verb + quote + rf"(?:{_spellings(n)})\b", task, re.IGNORECASE) for n in tool_names):
        return ()
    return tuple(sorted(n for n in tool_names if re.search(rf"\b(?:{_spellings(n)})\b", task, re.IGNORECASE)))


@dataclass(frozen=True, slots=True)
class Allowed:
    """What the next action may be: `tools` (names; empty = none) and whether it may answer."""

    tools: tuple[str, ...]
    answer: bool


def allowed_actions(choice: str, task: str | None, tool_names: Collection[str], first: bool) -> Allowed:
    """The actions the grammar allows for one call. `first`: no tool was called on this branch yet."""
    names = tuple(sorted(tool_names))
    if choice == "none" or not names:
        return Allowed((), True)
    if not first or (choice == "auto" and not task):
        return Allowed(names, True)
    if choice == "auto":
        named = named_in_task(task or "", names)
        return Allowed(named, False) if named else Allowed(names, True)
    if choice == "required":
        return Allowed(names, False)
    return Allowed((choice,), False)
