"""OpenAI tool calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`.

- A request's tools become a `ToolPlan` (validated here: a bad definition or choice is a 400 naming
  the field). The plan's grammar (runtime/server/tool_grammar.py) forces `required` and named
  choices and keeps any call the model starts under `auto` valid against the tool's schema.
- The prompt: the tool list goes into the system turn as a fixed text block (tool_prompt.py), or into
  the model's own chat template when that template takes `tools`. Assistant `tool_calls` and
  `role: "tool"` results of the history are rendered too.
- The response: the output is split into `content` and `tool_calls` by the server's format
  (`--tool-call-parser`), with `finish_reason: "tool_calls"` when there are calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime import grammar_guard
from runtime.errors import GrammarError
from runtime.server import tool_grammar
from runtime.server.errors import ApiError, format_validation_errors
from runtime.server.tool_formats import Parsed, RawCall, ToolFormat

Choice = Literal["none", "auto", "required"]

_EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}


class _FunctionDef(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
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
    parameters: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The OpenAI-shaped definition as the prompt shows it."""
        function: dict[str, Any] = {"name": self.name}
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

    def grammar(self, text_schema: dict[str, Any] | None, begin_token: bool = False) -> str:
        chosen = [t for t in self.tools if self.forced is None or t.name == self.forced]
        pairs = [(t.name, _grammar_params(t.parameters)) for t in chosen]
        choice = "required" if self.forced is not None else self.choice
        # a named tool is one call (as SGLang and vLLM force it); parallel_tool_calls governs the rest
        parallel = self.parallel and self.forced is None
        return tool_grammar.build(self.fmt, choice, pairs, parallel, text_schema, begin_token)


def _grammar_params(params: dict[str, Any]) -> dict[str, Any]:
    """The arguments schema the grammar enforces: the tool's, with undeclared properties shut out
    when it lists properties and says nothing (a subset of what it allows; small models otherwise
    invent keys)."""
    if "properties" in params and "additionalProperties" not in params:
        return {**params, "additionalProperties": False}
    return params


#: tools in one request, and the bytes of all their parameter schemas together: each schema is
#: compiled, so the count and total bound the work one request can ask for
MAX_TOOLS = 128
MAX_TOOLS_SCHEMA_BYTES = 262_144


def _check_parameters(index: int, params: dict[str, Any]) -> None:
    """The same guarded path response_format takes (runtime/grammar_guard.py): bounds first, then
    llguidance in the big-stack thread (a 3,000-hop $ref chain crashed the default stack)."""
    import llguidance

    where = f"tools.{index}.function.parameters"
    if params.get("type", "object") != "object":
        raise ApiError(400, f"{where}: must be a JSON schema of type 'object'")
    try:
        grammar_guard.check_json_schema(json.dumps(params, sort_keys=True), where)
    except GrammarError as exc:
        raise ApiError(400, str(exc)) from None
    except (ValueError, RecursionError):
        raise ApiError(400, f"{where}: nested deeper than {grammar_guard.MAX_SCHEMA_DEPTH} levels") from None

    def validate() -> str:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(_grammar_params(params))
        return str(llguidance.LLMatcher.validate_grammar(grammar) or "")

    try:
        error = grammar_guard.run_with_big_stack(validate)
    except (ValueError, TypeError, RecursionError) as exc:
        error = str(exc) or type(exc).__name__
    if error:
        raise ApiError(400, f"{where}: not a JSON schema this server can enforce: {error}")


def _check_bounds(raw: list[dict[str, Any]]) -> None:
    if len(raw) > MAX_TOOLS:
        raise ApiError(400, f"tools: {len(raw)} tools; the limit is {MAX_TOOLS}")
    size = 0
    for i, item in enumerate(raw):
        try:
            size += len(json.dumps(item))
        except (ValueError, TypeError, RecursionError):
            where = f"tools.{i}.function.parameters"
            raise ApiError(
                400, f"{where}: nested deeper than {grammar_guard.MAX_SCHEMA_DEPTH} levels"
            ) from None
    if size > MAX_TOOLS_SCHEMA_BYTES:
        raise ApiError(400, f"tools: {size} bytes of definitions; the limit is {MAX_TOOLS_SCHEMA_BYTES}")


def _tools(raw: list[dict[str, Any]]) -> tuple[Tool, ...]:
    _check_bounds(raw)
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        try:
            spec = _ToolDef.model_validate(item)
        except ValidationError as exc:
            raise ApiError(
                400, f"tools.{i}: {format_validation_errors([dict(e) for e in exc.errors()])}"
            ) from exc
        fn = spec.function
        params = fn.parameters if fn.parameters is not None else _EMPTY_PARAMS
        _check_parameters(i, params)
        if any(t.name == fn.name for t in tools):
            raise ApiError(400, f"tools.{i}.function.name: {fn.name!r} is defined twice")
        tools.append(Tool(fn.name, fn.description, params))
    return tuple(tools)


def _choice(raw: str | dict[str, Any] | None, tools: tuple[Tool, ...]) -> tuple[Choice, str | None]:
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
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None,
    fmt: ToolFormat,
) -> ToolPlan | None:
    """The request's tool plan, or None when it has no tools (and asks nothing of them)."""
    defs = _tools(tools or [])
    choice, forced = _choice(tool_choice, defs)
    if not defs:
        return None
    return ToolPlan(defs, choice, forced, parallel_tool_calls is not False, fmt)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_calls(calls: tuple[RawCall, ...], ids: list[str]) -> list[dict[str, Any]]:
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
