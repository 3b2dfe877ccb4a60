"""`@tool`: a typed Python function (sync or async) becomes a Tool the model can call.

Arguments are validated by a pydantic model derived from the signature; the JSON schema the
model sees comes from that model plus the docstring, serialized as canonical JSON (sorted
keys, fixed separators) so that the prompt head is byte-stable across processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from agent.errors import ToolError
from agent.examples import Example


def canonical_json(value: object) -> str:
    """One spelling per value: sorted keys, no whitespace, UTF-8 kept (no \\u escapes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What one call produced: `result` text on success, else `error` (+ its kind)."""

    result: str | None
    error: str | None = None
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable tool. `expected_s` is reported to the cache while the agent waits on it."""

    name: str
    description: str
    fn: Callable[..., object]
    args_model: type[BaseModel]
    expected_s: float | None = None
    timeout_s: float | None = None
    #: worked examples of this tool in use; the agent puts them in its cached head
    examples: tuple[Example, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"tool name {self.name!r} must be an identifier")
        object.__setattr__(self, "examples", tuple(self.examples))

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def parameters_schema(self) -> dict[str, object]:
        """JSON schema of the arguments object, without pydantic's cosmetic titles."""
        schema = self.args_model.model_json_schema()
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}

    def spec(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters_schema()}

    def spec_json(self) -> str:
        return canonical_json(self.spec())

    def __call__(self, *args: object, **kwargs: object) -> Any:
        """Calling a Tool directly calls the wrapped function (handy in tests and plain code)."""
        # Any: the result is whatever the wrapped function returns, for the caller to use as such
        return self.fn(*args, **kwargs)

    def invoke(self, arguments: object) -> ToolResult:
        """Validate and run; every failure comes back as a ToolResult, never as an exception."""
        try:
            value = self._invoke(arguments)
        except ToolError as exc:
            return ToolResult(None, exc.message, exc.kind)
        return ToolResult(value if isinstance(value, str) else canonical_json(value))

    def _invoke(self, arguments: object) -> object:
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}", "validation")
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(_short_validation(exc), "validation") from None
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        try:
            if self.is_async:
                pending = cast(Awaitable[object], self.fn(**kwargs))  # is_async: a coroutine
                return asyncio.run(asyncio.wait_for(pending, self.timeout_s))
            return _call_with_timeout(self.fn, kwargs, self.timeout_s)
        except (TimeoutError, concurrent.futures.TimeoutError):
            raise ToolError(f"timed out after {self.timeout_s} s", "timeout") from None
        except ToolError:
            raise
        except Exception as exc:  # a tool's own failure is data for the model, not a crash
            raise ToolError(f"{type(exc).__name__}: {exc}", "exception") from None


def _call_with_timeout(
    fn: Callable[..., object], kwargs: dict[str, object], timeout_s: float | None
) -> object:
    if timeout_s is None:
        return fn(**kwargs)
    # A thread cannot be killed: on timeout the call keeps running detached and its result is dropped.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool")
    try:
        return pool.submit(fn, **kwargs).result(timeout=timeout_s)
    finally:
        pool.shutdown(wait=False)


def _short_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _strip_titles(schema: object) -> object:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """First paragraph = description; `name: text` lines under Args:/Parameters: = field docs."""
    if not doc:
        return "", {}
    text = inspect.cleandoc(doc)
    description = text.split("\n\n", 1)[0].replace("\n", " ").strip()
    fields: dict[str, str] = {}
    section = re.split(r"^(?:Args|Arguments|Parameters):\s*$", text, maxsplit=1, flags=re.M)
    if len(section) == 2:
        current = None
        for line in section[1].splitlines():
            match = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", line)
            if match:
                current = match.group(1)
                fields[current] = match.group(2).strip()
            elif current and line.strip() and line.startswith((" ", "\t")):
                fields[current] += " " + line.strip()
            elif line.strip():
                break
    if len(section) == 2 and description.startswith(("Args:", "Parameters:")):
        description = ""
    return description, fields


def _args_model(fn: Callable[..., object], name: str, docs: dict[str, str]) -> type[BaseModel]:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}  # pydantic field definitions: (annotation, FieldInfo)
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=docs.get(param.name)))
    model_name = "".join(part.title() for part in name.split("_")) + "Args"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


@overload
def tool(
    fn: Callable[..., object],
    *,
    name: str | None = ...,
    description: str | None = ...,
    expected_s: float | None = ...,
    timeout_s: float | None = ...,
    examples: Sequence[Example] = ...,
) -> Tool: ...
@overload
def tool(
    fn: None = None,
    *,
    name: str | None = ...,
    description: str | None = ...,
    expected_s: float | None = ...,
    timeout_s: float | None = ...,
    examples: Sequence[Example] = ...,
) -> Callable[[Callable[..., object]], Tool]: ...
def tool(
    fn: Callable[..., object] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    expected_s: float | None = None,
    timeout_s: float | None = None,
    examples: Sequence[Example] = (),
) -> Tool | Callable[[Callable[..., object]], Tool]:
    """Decorator: `@tool` or `@tool(name=..., expected_s=..., timeout_s=..., examples=[...])` -> Tool."""

    def wrap(func: Callable[..., object]) -> Tool:
        tool_name = name or func.__name__
        summary, docs = _parse_docstring(func.__doc__)
        return Tool(
            name=tool_name,
            description=description if description is not None else summary,
            fn=func,
            args_model=_args_model(func, tool_name, docs),
            expected_s=expected_s,
            timeout_s=timeout_s,
            examples=tuple(examples),
        )

    return wrap(fn) if fn is not None else wrap
