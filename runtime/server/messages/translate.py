"""Messages request -> the ChatCompletionRequest /v1/chat/completions serves (same templates, tool
grammar, reasoning parser and GenerationRequest path); chat body -> Anthropic message."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from runtime.server.errors import ApiError, format_validation_errors
from runtime.server.messages.models import CountTokensRequest, MessageParam, MessagesRequest
from runtime.server.schemas import ChatCompletionRequest


def _text(blocks: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    parts = []
    for b in blocks:
        if b.get("type") != "text":
            raise ApiError(400, f"{where}: block type {b.get('type')!r} not supported here")
        parts.append(str(b.get("text", "")))
    return "".join(parts)


def _user(m: MessageParam) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for b in m.content:
        kind = b.get("type")
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_result":
            body = b.get("content", "")
            result = _text(body, "tool_result.content") if body else ""
            if b.get("is_error"):
                result = f"Error: {result}"
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
        else:
            raise ApiError(400, f"messages: content block type {kind!r} not supported")
    if text:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(m: MessageParam) -> dict[str, object]:
    if isinstance(m.content, str):
        return {"role": "assistant", "content": m.content}
    text, thinking, calls = [], [], []
    for b in m.content:
        kind = b.get("type")
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(str(b.get("thinking", "")))
        elif kind == "tool_use":
            args = json.dumps(b.get("input", {}))
            calls.append(
                {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": args}}
            )
        else:
            raise ApiError(400, f"messages: assistant block type {kind!r} not supported")
    msg: dict[str, object] = {"role": "assistant", "content": "".join(text)}
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def chat_messages(req: CountTokensRequest) -> list[dict[str, object]]:
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for m in req.messages:
        out.extend(_user(m) if m.role == "user" else [_assistant(m)])
    return out


def _tools(req: CountTokensRequest) -> tuple[list[dict[str, Any]] | None, Any, bool | None]:
    choice = req.tool_choice or {"type": "auto"}
    kind = choice.get("type")
    parallel = None if "disable_parallel_tool_use" not in choice else not choice["disable_parallel_tool_use"]
    if not req.tools:
        return None, None, None
    tools = []
    for t in req.tools:
        if "input_schema" not in t:
            raise ApiError(400, f"tools: tool type {t.get('type')!r} not supported (custom tools only)")
        fn = {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}
        tools.append({"type": "function", "function": fn})
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if kind == "tool":
        return tools, {"type": "function", "function": {"name": choice["name"]}}, parallel
    if mapped is None:
        raise ApiError(400, f"tool_choice.type: {kind!r} not supported")
    return tools, mapped, parallel


def _format(req: CountTokensRequest) -> dict[str, object] | None:
    fmt = (req.output_config or {}).get("format")
    if set(req.output_config or {}) - {"format"}:
        raise ApiError(400, "output_config: only `format` is supported")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, "output_config.format: must be an object")
    if fmt.get("type") != "json_schema":
        raise ApiError(400, f"output_config.format.type: {fmt.get('type')!r} not supported")
    if "schema" not in fmt:
        raise ApiError(400, "output_config.format.schema: required")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_request(req: CountTokensRequest, salt: str | None = None) -> ChatCompletionRequest:
    tools, choice, parallel = _tools(req)
    fields: dict[str, object] = {"messages": chat_messages(req), "tools": tools, "tool_choice": choice}
    if parallel is not None:
        fields["parallel_tool_calls"] = parallel
    fmt = _format(req)
    if fmt is not None:
        fields["response_format"] = fmt
    if isinstance(req, MessagesRequest):
        fields.update(max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature)
        fields.update(top_p=req.top_p, top_k=req.top_k)
        fields.update(prefix_cache=req.prefix_cache)
        if req.session_id is not None:
            fields["session_id"] = req.session_id
        user = req.metadata.user_id if req.metadata is not None else None
        if user is not None:  # Claude-style clients name the conversation here: the trace session
            fields["user"] = str(user)
            fields["prompt_cache_key"] = str(user)[:256]
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # e.g. a schema nested past the body's depth limit
        raise ApiError(400, format_validation_errors(exc.errors())) from None
