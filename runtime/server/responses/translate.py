"""Responses input items -> the chat-completions body that /v1/chat/completions already serves.

So tool calls go through the same tool templates, grammar-forced JSON arguments, reasoning parser and
GenerationRequest path as chat. An item, part or key this cannot carry is a ValueError naming it
(a 400). `previous_response_id` prepends the stored chain's items (runtime/server/responses/store.py);
the chat path re-sends earlier outputs as the tokens generated (runtime/server/reasoning_history.py).
"""

from __future__ import annotations

from typing import Any

from runtime.server.responses.models import ResponsesRequest

_TEXT_PARTS = ("input_text", "output_text", "text")
#: the keys each part and item may carry: what clients send back (ids, status, annotations,
#: logprobs, OpenAI's cache breakpoint) is taken; anything else is a 400 naming it
_PART_KEYS = {"type", "text", "annotations", "logprobs", "prompt_cache_breakpoint"}
_ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}


def _known(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise ValueError(f"{where}: {', '.join(map(repr, extra))} not supported here")


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise ValueError(f"{where}: content part type {kind!r} is not supported here")
        _known(part, _PART_KEYS, f"{where}.content[{j}]")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _item_message(item: dict[str, Any], i: int, messages: list[dict[str, Any]]) -> None:
    kind = item.get("type", "message")
    where = f"input[{i}]"
    if kind in _ITEM_KEYS:
        _known(item, _ITEM_KEYS[kind], where)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ValueError(f"{where}: role {role!r} is not supported")
        role = "system" if role == "developer" else role  # chat templates know no developer role
        messages.append({"role": role, "content": _text(item.get("content", ""), where)})
    elif kind == "function_call":
        call = {"id": item["call_id"], "type": "function"}
        call["function"] = {"name": item["name"], "arguments": item.get("arguments", "")}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)  # parallel calls of one turn stay one assistant turn
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = _text(item.get("output", ""), where)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
    elif kind == "reasoning":
        return  # passed back by clients; the chat template re-renders reasoning itself
    else:
        raise ValueError(f"{where}: item type {kind!r} is not supported here")


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return list(req.input)


def to_messages(req: ResponsesRequest, context: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """instructions, then the stored chain's items (`context`), then this request's input."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    for i, item in enumerate([*(context or []), *input_items(req)]):
        _item_message(item, i, messages)
    return messages


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if req.tools is None:
        return None
    out = []
    for tool in req.tools:
        fields = tool.model_dump(exclude={"type"})
        out.append({"type": "function", "function": fields})
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise ValueError(f"text.format: type {fmt.get('type')!r} is not supported")


def to_chat_body(req: ResponsesRequest, context: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The chat-completions body equivalent to `req` after `context` (our extras passed on as on
    chat)."""
    body: dict[str, object] = {
        "messages": to_messages(req, context),
        "tools": _tools(req),
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req.text),
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "regex": req.regex,
        "ebnf": req.ebnf,
        "model": req.model,
        "prefix_cache": req.prefix_cache,
        "reasoning_effort": req.reasoning.effort if req.reasoning is not None else None,
    }
    return {k: v for k, v in body.items() if v is not None}
