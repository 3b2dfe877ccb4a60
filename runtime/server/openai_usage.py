"""The OpenAI `finish_reason` and `usage` of engine results, shared by the plain endpoints
(openai_api.py) and tool calling (tools/chat.py), which openai_api imports: a leaf, so neither
needs the other."""

from __future__ import annotations

from typing import Any


def finish_of(meta: dict[str, Any]) -> tuple[str, Any]:
    """(finish_reason, matched_stop) of an engine meta_info."""
    reason = meta.get("finish_reason") or {}
    if isinstance(reason, dict):
        return str(reason.get("type", "stop")), reason.get("matched")
    return str(reason), None


def usage(metas: list[dict[str, Any]], choices: int = 1) -> dict[str, Any]:
    """Token counts; with n choices per prompt the prompt (and its cached part) counts once."""
    prompt = sum(int(m.get("prompt_tokens", 0)) for m in metas[::choices])
    completion = sum(int(m.get("completion_tokens", 0)) for m in metas)
    cached = sum(int(m.get("cached_tokens", 0) or 0) for m in metas[::choices])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
