"""OpenAI tool calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`.

- A request's tools become a `ToolPlan` (validated here: a bad definition or choice is a 400 naming
  the field). The plan's grammar (runtime/server/tools/grammar.py) forces `required` and named
  choices and keeps any call the model starts under `auto` valid against the tool's schema.
- The prompt: the tool list goes into the system turn as a fixed text block (prompt.py), or into
  the model's own chat template when that template takes `tools`. Assistant `tool_calls` and
  `role: "tool"` results of the history are rendered too.
- The response: the output is split into `content` and `tool_calls` by the server's format
  (`--tool-call-parser`), with `finish_reason: "tool_calls"` when there are calls.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.engine import grammar_guard
from runtime.errors import GrammarError
from runtime.server.errors import ApiError, format_validation_errors
from runtime.server.tools import grammar as tool_grammar
from runtime.server.tools.formats import Parsed, RawCall, ToolFormat

Choice = Literal["none", "auto", "required"]

_EMPTY_PARAMS: dict[str, object] = {"type": "object", "properties": {}}


class _FunctionDef(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, object] | None = None
    # honoured by construction: every call's arguments are held to the schema by the grammar
    strict: bool | None = None


class _ToolDef(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"]
    function: _FunctionDef


class _NamedChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    class _Name(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        name: str

    type: Literal["function"]
    function: _Name


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, object]

    def definition(self) -> dict[str, object]:
        """The OpenAI-shaped definition as the prompt shows it."""
        function: dict[str, object] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What one request asks of tools. `forced` names the tool of a named `tool_choice`."""

    tools: tuple[Tool, ...]
    choice: Choice
    forced: str | None
    parallel: bool
    fmt: ToolFormat

    @property
    def may_call(self) -> bool:
        return self.choice != "none" and bool(self.tools)

    def grammar(self, text_schema: dict[str, object] | None, begin_token: bool = False) -> str:
        chosen = [t for t in self.tools if self.forced is None or t.name == self.forced]
        pairs = [(t.name, _grammar_params(t.parameters)) for t in chosen]
        choice = "required" if self.forced is not None else self.choice
        # a named tool is one call (as SGLang and vLLM force it); parallel_tool_calls governs the rest
        parallel = self.parallel and self.forced is None
        return tool_grammar.build(self.fmt, choice, pairs, parallel, text_schema, begin_token)


def _grammar_params(params: dict[str, object]) -> dict[str, object]:
    """The arguments schema the grammar enforces: the tool's, with undeclared properties shut out
    when it lists properties and says nothing (a subset of what it allows; small models otherwise
    invent keys)."""
    if "properties" in params and "additionalProperties" not in params:
        return {**params, "additionalProperties": False}
    return params


def _tools(raw: list[dict[str, object]]) -> tuple[Tool, ...]:
    """The request's tools, each schema bounded (grammar_guard) and compiled once to prove the
    grammar can enforce it: a 400 naming the tool otherwise. Runs off the event loop (`aplan`)."""
    if len(raw) > grammar_guard.MAX_TOOLS:  # before validating 25,000 definitions one by one
        raise ApiError(400, f"tools: {len(raw):,} tools; the limit is {grammar_guard.MAX_TOOLS}")
    specs = [_tool_def(i, item) for i, item in enumerate(raw)]
    params = [fn.parameters if fn.parameters is not None else _EMPTY_PARAMS for fn in specs]
    for i, p in enumerate(params):
        if not isinstance(p, dict) or p.get("type", "object") != "object":
            raise ApiError(400, f"tools.{i}.function.parameters: must be a JSON schema of type 'object'")
    try:
        texts = grammar_guard.check_tool_schemas([_grammar_params(p) for p in params])
    except GrammarError as exc:
        raise ApiError(400, str(exc)) from exc
    tools: list[Tool] = []
    for i, (fn, p, text) in enumerate(zip(specs, params, texts, strict=True)):
        error = grammar_guard.schema_error(text)
        if error:
            raise ApiError(
                400, f"tools.{i}.function.parameters: not a JSON schema this server can enforce: {error}"
            )
        if any(t.name == fn.name for t in tools):
            raise ApiError(400, f"tools.{i}.function.name: {fn.name!r} is defined twice")
        tools.append(Tool(fn.name, fn.description, p))
    # canonical order: the same tools sent in another order render the same head (issue 35)
    return tuple(sorted(tools, key=lambda t: t.name))


def _tool_def(index: int, item: dict[str, object]) -> _FunctionDef:
    try:
        return _ToolDef.model_validate(item).function
    except ValidationError as exc:
        raise ApiError(
            400, f"tools.{index}: {format_validation_errors([dict(e) for e in exc.errors()])}"
        ) from exc


def _choice(raw: str | dict[str, object] | None, tools: tuple[Tool, ...]) -> tuple[Choice, str | None]:
    if raw is None:
        return ("auto" if tools else "none"), None
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            raise ApiError(
                400, f"tool_choice: {raw!r} is not one of 'none', 'auto', 'required' or a named function"
            )
        if raw == "required" and not tools:
            raise ApiError(400, "tool_choice: 'required' needs a non-empty 'tools' list")
        return raw, None  # type: ignore[return-value]
    try:
        name = _NamedChoice.model_validate(raw).function.name
    except ValidationError as exc:
        message = format_validation_errors([dict(e) for e in exc.errors()])
        raise ApiError(
            400, f"tool_choice: expected {{'type': 'function', 'function': {{'name': ...}}}}: {message}"
        ) from exc
    if not any(t.name == name for t in tools):
        raise ApiError(400, f"tool_choice.function.name: {name!r} is not in 'tools'")
    return "required", name


def plan(
    tools: list[dict[str, object]] | None,
    tool_choice: str | dict[str, object] | None,
    parallel_tool_calls: bool | None,
    fmt: ToolFormat,
) -> ToolPlan | None:
    """The request's tool plan, or None when it has no tools (and asks nothing of them)."""
    defs = _tools(tools or [])
    choice, forced = _choice(tool_choice, defs)
    if not defs:
        return None
    # `required` allows several calls only when asked (parallel_tool_calls: true): after a complete
    # call the bundled model repeats it when the grammar lets it (two identical calls, 16 s instead
    # of 6 s), and a cut-off repeat turned a good call into a `length` finish
    parallel = parallel_tool_calls is True if choice == "required" else parallel_tool_calls is not False
    return ToolPlan(defs, choice, forced, parallel, fmt)


async def aplan(
    tools: list[dict[str, object]] | None,
    tool_choice: str | dict[str, object] | None,
    parallel_tool_calls: bool | None,
    fmt: ToolFormat,
) -> ToolPlan | None:
    """`plan` in a worker thread: compiling a request's schemas must never hold the event loop
    (25,000 small tools once blocked /health for 45 s)."""
    return await asyncio.to_thread(plan, tools, tool_choice, parallel_tool_calls, fmt)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_calls(calls: tuple[RawCall, ...], ids: list[str]) -> list[dict[str, object]]:
    return [
        {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c, cid in zip(calls, ids, strict=True)
    ]


def split_output(parsed: Parsed) -> tuple[str | None, bool]:
    """(content, has_calls): content is the text before the calls, None when empty beside calls."""
    if not parsed.calls:
        return parsed.content, False
    content = parsed.content.strip()
    return (content or None), True
