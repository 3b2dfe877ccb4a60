"""The same tool agent through the `openai` client's chat completions (the reference door).

`chat_transcript(base_url, turns=6)`: every call but the last must use a tool (`tool_choice:
required`), the tool runs and its result goes back as a `tool` message; the last call answers in
text (`tool_choice: none`). Returns one cache row per call and the messages of the last call.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from evals.benchmarks.doors.anthropic_agent import QUESTION, SYSTEM, run_tool
from evals.benchmarks.doors.responses_agent import TOOLS as RESPONSES_TOOLS

TOOLS = [
    {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in RESPONSES_TOOLS
]


def chat_transcript(
    base_url: str,
    turns: int = 6,
    api_key: str = "unused",
    model: str = "default",
    max_tokens: int = 64,
    session: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, the messages the last call was sent); `session`: the X-Session-Id header."""
    headers = {"X-Session-Id": session} if session else None
    client = openai.OpenAI(
        base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=600, default_headers=headers
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    rows, sent = [], messages
    for call in range(1, turns + 1):
        sent = list(messages)
        r = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="none" if call == turns else "required",
            temperature=0,
            max_tokens=max_tokens,
        )
        assert r.usage is not None
        cached = int((r.usage.prompt_tokens_details and r.usage.prompt_tokens_details.cached_tokens) or 0)
        prompt = int(r.usage.prompt_tokens)
        rows.append(
            {
                "call": call,
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": cached / max(prompt, 1),
            }
        )
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not msg.tool_calls:
            break
        for tc in msg.tool_calls:
            result = run_tool(tc.function.name, json.loads(tc.function.arguments or "{}"))  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    return rows, sent


def last_request(
    messages: list[dict[str, Any]], model: str = "default", max_tokens: int = 64
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "none",
        "temperature": 0,
        "max_tokens": max_tokens,
    }
