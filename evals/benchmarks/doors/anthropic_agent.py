"""A tool agent through the real `anthropic` client against a radixagent server's /v1/messages.

`run_anthropic_agent(base_url, turns=6)` makes `turns` model calls in one conversation: every call but
the last must use a tool (`tool_choice: any`); the tool really runs and its result goes back as a
`tool_result`; the last call answers in text (`tool_choice: none`). Returns one row per call with the
prompt tokens, the part read from cache and the hit rate, for evals/benchmarks/door_agent_cache.py.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

#: An agent's standing instructions, as agent frameworks send them on every call (real ones run
#: from a few hundred to many thousand tokens): the head every call shares.
SYSTEM = """You are a helpful assistant with tools. Use them, then answer briefly.

Operating rules:
1. Read the whole request before acting. Split it into steps and do them in order.
2. Use a tool for every computation and every fact about the world; never guess a number.
3. Call one tool at a time and wait for its result before the next call.
4. Pass arguments exactly as the tool's schema asks: integers as integers, names as written.
5. If a tool returns an error, read it, fix the arguments and try once more.
6. Keep intermediate results; refer to them by value in later calls.
7. Do not repeat a call whose result you already have.
8. When every step is done, answer in one or two sentences with the final values.
9. Never invent tools, arguments or results. If no tool fits, say so plainly.
10. Units: temperatures in degrees Celsius, distances in kilometres, money with its currency.
11. Be concise: no preamble, no apologies, no restating the question.
12. If the request is ambiguous, pick the most common reading and state it in the answer.

Tool notes:
- add(a, b) returns the sum of two integers as a decimal string.
- get_weather(city) returns JSON with the city, the temperature in degrees Celsius and the sky.
- Results are exact; do not round them. Cities are matched by name, case-insensitively.
"""
TOOLS: list[dict[str, Any]] = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
]
QUESTION = "Add 2 and 3, add 4 to that, then tell me the weather in Oslo."


def run_tool(name: str, args: dict[str, Any]) -> str:
    if name == "add":
        return str(int(args["a"]) + int(args["b"]))
    return json.dumps({"city": args.get("city", ""), "temperature_c": 7, "sky": "cloudy"})


def _row(call: int, usage: Any) -> dict[str, Any]:
    cached = int(usage.cache_read_input_tokens or 0)
    prompt = int(usage.input_tokens) + cached + int(usage.cache_creation_input_tokens or 0)
    return {
        "call": call,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / max(prompt, 1),
    }


def _results(content: list[Any]) -> list[dict[str, Any]]:
    uses = [b for b in content if b.type == "tool_use"]
    return [
        {"type": "tool_result", "tool_use_id": u.id, "content": run_tool(u.name, dict(u.input))} for u in uses
    ]


def run_anthropic_agent(
    base_url: str, turns: int = 6, api_key: str = "unused", model: str = "default", max_tokens: int = 64
) -> list[dict[str, Any]]:
    """Per-call cache rows of a `turns`-call tool agent through the anthropic client (see module doc)."""
    return anthropic_transcript(base_url, turns, api_key, model, max_tokens)[0]


def last_request(
    messages: list[dict[str, Any]], model: str = "default", max_tokens: int = 64
) -> dict[str, Any]:
    """The body of the conversation's last call (for a TTFT replay), as the client sent it."""
    return {
        "model": model,
        "max_tokens": max_tokens,
        "system": SYSTEM,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": {"type": "none"},
        "temperature": 0,
    }


def anthropic_transcript(
    base_url: str,
    turns: int = 6,
    api_key: str = "unused",
    model: str = "default",
    max_tokens: int = 64,
    session: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, the messages the last call was sent). `session` names the conversation for the
    server's --trace-dir (the X-Session-Id header)."""
    headers = {"X-Session-Id": session} if session else None
    client = anthropic.Anthropic(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=600, default_headers=headers
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    rows, sent = [], messages
    for call in range(1, turns + 1):
        sent = list(messages)
        choice = {"type": "none"} if call == turns else {"type": "any"}
        m = client.messages.create(  # type: ignore[call-overload]
            model=model,
            max_tokens=max_tokens,
            system=SYSTEM,
            messages=messages,
            tools=TOOLS,
            tool_choice=choice,
            extra_body={"temperature": 0},
        )
        rows.append(_row(call, m.usage))
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
        )
        results = _results(m.content)
        if not results:
            break
        messages.append({"role": "user", "content": results})
    return rows, sent
