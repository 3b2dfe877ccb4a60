"""Agent frameworks pointed at the real server: the OpenAI Agents SDK and langchain-openai.

Their tools really run and their results reach the next turn; from the second model call on, the
cache serves at least 90% of the previous call's prompt. No traffic leaves the machine: the Agents
SDK's tracing and LangSmith are off.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _no_tracing() -> None:
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    os.environ["LANGSMITH_TRACING"] = "false"
    os.environ.pop("LANGCHAIN_TRACING_V2", None)


def test_agents_sdk_function_tool_runs_and_its_result_reaches_the_next_turn(server: Any) -> None:
    pytest.importorskip("agents")
    _no_tracing()
    import httpx
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    bodies: list[dict[str, Any]] = []

    async def record(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content))

    client = AsyncOpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=300,
        http_client=httpx.AsyncClient(event_hooks={"request": [record]}, timeout=300),
    )
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        ran.append(city)
        return f"Weather report: 17 degrees and windy in {city}."

    agent = Agent(
        name="weather",
        instructions="You answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="default", openai_client=client),
        # forced on the first call; the SDK resets tool_choice after a tool ran, so the run ends
        model_settings=ModelSettings(
            tool_choice="get_weather", parallel_tool_calls=False, temperature=0, max_tokens=40
        ),
    )
    result = Runner.run_sync(agent, "What is the weather in Oslo?", max_turns=4)
    assert len(ran) == 1 and ran[0]  # the Python function really ran, with a string city
    assert isinstance(result.final_output, str) and result.final_output
    # the tool's result was in the next request, after the assistant's call
    second = bodies[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": second[-2]["tool_calls"][0]["id"],
        "content": f"Weather report: 17 degrees and windy in {ran[0]}.",
    }
    usages = [r.usage for r in result.raw_responses]
    assert len(usages) >= 2
    for prev, cur in zip(usages, usages[1:], strict=False):
        assert cur.input_tokens_details.cached_tokens >= 0.9 * prev.input_tokens


def test_langchain_bind_tools_and_a_tool_loop(server: Any) -> None:
    pytest.importorskip("langchain_openai")
    _no_tracing()
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    llm = ChatOpenAI(
        model="default",
        base_url=f"{server.url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=40,
        max_retries=0,
        timeout=300,
    )
    bound = llm.bind_tools([multiply], tool_choice="multiply")
    history: list[Any] = [HumanMessage("What is 6 times 7? Use the tool.")]
    first = bound.invoke(history)
    assert len(first.tool_calls) == 1 and first.tool_calls[0]["name"] == "multiply"
    args = first.tool_calls[0]["args"]
    assert set(args) == {"a", "b"} and all(type(v) is int for v in args.values())
    history += [first, ToolMessage(str(multiply.invoke(args)), tool_call_id=first.tool_calls[0]["id"])]
    answer = llm.bind_tools([multiply], tool_choice="none").invoke(history)
    assert isinstance(answer.content, str) and not answer.tool_calls
    prompt = first.usage_metadata["input_tokens"]
    assert answer.usage_metadata["input_token_details"]["cache_read"] >= 0.9 * prompt


def test_langchain_structured_output_default_and_function_calling(server: Any) -> None:
    pytest.importorskip("langchain_openai")
    _no_tracing()
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person mentioned in the text."""

        name: str = Field(description="the person's first name")
        age: int

    llm = ChatOpenAI(
        model="default",
        base_url=f"{server.url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=40,
        max_retries=0,
        timeout=300,
    )
    text = "Alice is 31 years old. Extract the person."
    default = llm.with_structured_output(Person).invoke(text)
    assert isinstance(default, Person)
    via_tools = llm.with_structured_output(Person, method="function_calling").invoke(text)
    assert isinstance(via_tools, Person)
