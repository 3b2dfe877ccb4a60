"""Chat completion body -> the Responses API's `response` object (output items, usage, status)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from runtime.server.responses.models import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """input_tokens is the whole prompt, cached_tokens the part read from the prefix cache (OpenAI's
    convention; Anthropic's is the opposite)."""
    prompt = int(chat_usage.get("prompt_tokens", 0))
    output = int(chat_usage.get("completion_tokens", 0))
    cached = int((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0)
    reasoning = int((chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0) or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


def output_items(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """reasoning (when a parser split it out), then the text message, then one item per call."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        text = {"type": "reasoning_text", "text": message["reasoning_content"]}
        items.append({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [text]})
    if message.get("content"):
        part = {"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": new_id("msg"),
                "role": "assistant",
                "status": status,
                "content": [part],
            }
        )
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        items.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
                "status": "completed",
            }
        )
    return items


def _tool_echo(req: ResponsesRequest) -> list[dict[str, object]]:
    return [t.model_dump() for t in req.tools or []]


def head(rid: str, req: ResponsesRequest, model: str) -> dict[str, object]:
    """The response object's fields that do not depend on the output (its request echoed)."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "error": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": req.store,
        "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": _tool_echo(req),
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "metadata": req.metadata or {},
        "prompt_cache_key": req.prompt_cache_key,
        "service_tier": "default",  # one tier here, whichever was asked
    }


def status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """(status, incomplete_details) for a chat finish_reason: `length` is cut off."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response(rid: str, req: ResponsesRequest, model: str, chat: dict[str, Any]) -> dict[str, Any]:
    """The response object for one finished chat completion."""
    choice = chat["choices"][0]
    status, details = status_of(choice["finish_reason"])
    out = head(rid, req, model)
    out.update(status=status, incomplete_details=details, usage=usage(chat["usage"]))
    out["output"] = output_items(choice["message"], status)
    return out
