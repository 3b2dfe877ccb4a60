"""Chat completion body -> Anthropic `message` object."""

from __future__ import annotations

import json
import uuid
from typing import Any

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def new_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """input_tokens is the uncached part; the automatic cache writes every computed token without a
    surcharge, so cache_creation_input_tokens is 0 and input + cache_read is the whole prompt."""
    prompt = int(chat_usage.get("prompt_tokens", 0))
    cached = int((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0)
    return {
        "input_tokens": prompt - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": int(chat_usage.get("completion_tokens", 0)),
        "service_tier": "standard",
    }


def content(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        args = json.loads(fn["arguments"] or "{}")
        blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": args})
    return blocks


def message(msg_id: str, model: str, chat: dict[str, Any]) -> dict[str, Any]:
    choice = chat["choices"][0]
    reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
    matched = choice.get("matched_stop")
    stop_sequence = matched if isinstance(matched, str) else None
    if stop_sequence is not None:
        reason = "stop_sequence"
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content(choice["message"]),
        "stop_reason": reason,
        "stop_sequence": stop_sequence,
        "usage": usage(chat["usage"]),
    }
