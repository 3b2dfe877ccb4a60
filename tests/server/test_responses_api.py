"""OpenAI's Responses API through the real `openai` client (and the Agents SDK's default model class,
and LangChain's Responses mode) against the real server and model: plain, tools, a
previous_response_id chain that reuses the whole previous turn, streams, parse, stored responses,
and the 400s for what cannot be honoured."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from evals.benchmarks.doors.responses_agent import TOOLS

pytestmark = pytest.mark.slow

MODEL = "smollm2"
ADD = TOOLS[0]  # the benchmark agent's `add`: one definition
INSTRUCTIONS = "You are a helpful assistant with tools. Answer briefly."


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_plain_create(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, instructions=INSTRUCTIONS, input="Say hi.", max_output_tokens=8, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.output_text
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.input_tokens > 10 and r.usage.output_tokens >= 1
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_forced_function_call_has_schema_valid_arguments(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        input="What is 2 plus 3?",
        tools=[ADD],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "add" and calls[0].call_id
    args = json.loads(calls[0].arguments)
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())


def test_chain_reuses_the_whole_previous_turn(client: openai.OpenAI) -> None:
    """Turn 2 by previous_response_id: the tool call of turn 1 is re-rendered as generated, so every
    token of turn 1's prompt is a cache hit; the tool really runs between the turns."""
    first = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        input="What is 12 plus 30? Use the tool.",
        tools=[ADD],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    [call] = [item for item in first.output if item.type == "function_call"][:1]
    args = json.loads(call.arguments)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": str(args["a"] + args["b"])}
    second = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        input=[result],
        tools=[ADD],
        temperature=0,
        max_output_tokens=16,
    )
    assert first.usage is not None and second.usage is not None
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # the same chain sent in full (no previous_response_id) is the same prompt
    full = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        input=[
            {"role": "user", "content": "What is 12 plus 30? Use the tool."},
            {"type": "function_call", "call_id": call.call_id, "name": "add", "arguments": call.arguments},
            result,
        ],
        tools=[ADD],
        temperature=0,
        max_output_tokens=16,
    )
    assert full.usage is not None and full.usage.input_tokens == second.usage.input_tokens
    assert full.output_text == second.output_text


def test_stream_event_sequence(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8, temperature=0, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text and final.usage is not None
    # streamed responses are stored as the non-streamed ones are, and decode the same (greedy)
    assert client.responses.retrieve(final.id).output_text == final.output_text
    plain = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8, temperature=0)
    assert plain.output_text == final.output_text


def test_stream_function_call_events(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL,
        input="Add 4 and 5.",
        tools=[ADD],
        tool_choice={"type": "function", "name": "add"},
        temperature=0,
        max_output_tokens=64,
        stream=True,
    )
    events = list(stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done and json.loads(done[0].arguments) == json.loads(deltas)


class Sum(BaseModel):
    a: int
    b: int
    total: int


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    r = client.responses.parse(
        model=MODEL,
        input="Give a, b and their total for 2 + 2 as JSON.",
        text_format=Sum,
        temperature=0,
        max_output_tokens=64,
    )
    assert isinstance(r.output_parsed, Sum)


def test_stored_response_get_delete_and_input_items(server: Any, client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0)
    assert client.responses.retrieve(r.id).id == r.id
    items = client.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"]
    # another tenant (another cache_salt) sees nothing, exactly like an unknown id
    other = httpx.get(f"{server.url}/v1/responses/{r.id}", params={"cache_salt": "other"}, timeout=30)
    assert other.status_code == 404
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="again", previous_response_id=r.id, max_output_tokens=4)


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_a_twenty_turn_chain_never_drifts(client: openai.OpenAI) -> None:
    """Issue 35: every turn of a 20-turn previous_response_id chain reads the whole previous
    prompt and output from the cache (all but the output's last token, whose KV is never
    computed): the earlier outputs are re-sent as the tokens generated, never re-tokenized."""
    prev = None
    for turn in range(20):
        r = client.responses.create(
            model=MODEL,
            instructions=INSTRUCTIONS,
            input=f"Turn {turn}: name a colour.",
            previous_response_id=prev.id if prev is not None else None,
            max_output_tokens=6,
            temperature=0,
        )
        assert r.usage is not None
        if prev is not None:
            assert prev.usage is not None
            whole = prev.usage.input_tokens + prev.usage.output_tokens - 1
            assert r.usage.input_tokens_details.cached_tokens >= whole, (turn, r.usage, prev.usage)
        prev = r


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"text": {"verbosity": "low"}}, "verbosity"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"input": [{"type": "image_generation_call"}]}, "image_generation_call"),
        ({"input": [{"type": "function_call", "name": "add"}]}, "call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input_image"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi", "x_pad": 1}]}]},
            "x_pad",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "1", "x_extra": 2}]},
            "x_extra",
        ),
        ({"prompt_cache_retention": 5}, "prompt_cache_retention"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(server: Any, extra: dict[str, Any], named: str) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **extra}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


def test_agents_sdk_default_model_runs_a_tool(server: Any) -> None:
    """The Agents SDK's default model class (OpenAIResponsesModel) with a function tool that really
    runs, not streamed and streamed."""
    agents = pytest.importorskip("agents")
    calls: list[tuple[int, int]] = []

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=aclient)
    settings = agents.ModelSettings(temperature=0, max_tokens=200, tool_choice="required")
    agent = agents.Agent(
        name="adder",
        instructions=INSTRUCTIONS + " After the tool result, answer in one short sentence.",
        tools=[add],
        model=model,
        model_settings=settings,
        reset_tool_choice=True,
    )
    agents.set_tracing_disabled(True)

    async def both() -> tuple[Any, Any]:
        result = await agents.Runner.run(agent, "What is 2 plus 3?", max_turns=3)
        streamed = agents.Runner.run_streamed(agent, "What is 4 plus 5?", max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return result, streamed

    result, streamed = asyncio.run(both())
    assert len(calls) >= 2  # the tool ran in each run
    assert isinstance(result.final_output, str) and isinstance(streamed.final_output, str)


def test_langchain_responses_mode_binds_tools(server: Any) -> None:
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(
        model=MODEL,
        base_url=f"{server.url}/v1",
        api_key="unused",
        use_responses_api=True,
        temperature=0,
        max_tokens=48,
    )
    msg = llm.bind_tools([ADD], tool_choice="add").invoke("Add 7 and 8.")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "add"
    assert set(msg.tool_calls[0]["args"]) == {"a", "b"}
