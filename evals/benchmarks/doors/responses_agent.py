"""A tool agent through the OpenAI Agents SDK's default model class (`OpenAIResponsesModel`, i.e.
`POST /v1/responses`) against a radixagent server.

`agents_transcript(base_url, turns=6)` runs one `Agent` with the benchmark's two tools, tool use
forced on every call, for `turns` model calls (the SDK stops it with MaxTurnsExceeded after the last
one); the tools really run. Returns one cache row per model call (from the SDK's own usage) and the
body of its last request, for evals/benchmarks/door_agent_cache.py. Tracing is off: nothing leaves the
machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import openai

from evals.benchmarks.doors.anthropic_agent import QUESTION, SYSTEM, run_tool

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
]


def _agent(
    base_url: str,
    api_key: str,
    model: str,
    max_tokens: int,
    sent: list[dict[str, Any]],
    session: str | None = None,
) -> Any:
    """The SDK's agent; every request body it sends is appended to `sent` (the replay takes the
    last one exactly as the SDK wrote it: its own tool schemas and item fields)."""
    import agents

    @agents.function_tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return run_tool("add", {"a": a, "b": b})

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return run_tool("get_weather", {"city": city})

    async def keep(request: httpx.Request) -> None:
        if request.url.path.endswith("/responses"):
            sent.append(json.loads(request.content))

    headers = {"X-Session-Id": session} if session else None
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key=api_key,
        max_retries=0,
        timeout=600,
        default_headers=headers,
        http_client=httpx.AsyncClient(timeout=600, event_hooks={"request": [keep]}),
    )
    settings = agents.ModelSettings(temperature=0, max_tokens=max_tokens, tool_choice="required")
    return agents.Agent(
        name="door-agent",
        instructions=SYSTEM,
        tools=[add, get_weather],
        model=agents.OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=settings,
        reset_tool_choice=False,
    )


def agents_transcript(
    base_url: str,
    turns: int = 6,
    api_key: str = "unused",
    model: str = "default",
    max_tokens: int = 64,
    session: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, the body of the last call); `session`: the X-Session-Id header."""
    import agents

    rows: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []

    class Hooks(agents.RunHooks[Any]):
        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            usage = response.usage
            cached = int(usage.input_tokens_details.cached_tokens or 0)
            prompt = int(usage.input_tokens)
            rows.append(
                {
                    "call": len(rows) + 1,
                    "prompt_tokens": prompt,
                    "cached_tokens": cached,
                    "hit_rate": cached / max(prompt, 1),
                }
            )

    agents.set_tracing_disabled(True)
    agent = _agent(base_url, api_key, model, max_tokens, sent, session)

    async def run() -> None:
        # every call is forced to use a tool: the run ends by its turn limit
        with contextlib.suppress(agents.MaxTurnsExceeded):
            await agents.Runner.run(agent, QUESTION, max_turns=turns, hooks=Hooks())

    asyncio.run(run())
    return rows, sent[-1]


def last_request(body: dict[str, Any]) -> dict[str, Any]:
    """The body of the last call (for a TTFT replay), exactly as the SDK sent it."""
    return {k: v for k, v in body.items() if k != "stream"}
