"""Tool calling through the `openai` client against the real server and model: tool_choice required /
named / auto / none, streamed calls, parallel calls, multi-turn with tool results (and the cache)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import BadRequestError, OpenAI

from runtime.server.tools.formats import FORMATS
from runtime.server.tools.grammar import build

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "What is the weather in Rome?"},
]


@pytest.fixture(scope="module")
def client(server: Any) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _valid(call: Any) -> dict[str, Any]:
    """The call's arguments, checked against its tool's schema (the grammar's promise)."""
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and isinstance(args["city"], str)
        assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "add" and set(args) == {"a", "b"}
        assert all(type(v) is int for v in args.values())
    assert call.id.startswith("call_") and call.type == "function"
    return args


def _chat(client: OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 48)
    return client.chat.completions.create(model="default", messages=messages, temperature=0, **kw)


def test_required_is_one_valid_call(client: OpenAI) -> None:
    r = _chat(client, ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    _valid(choice.message.tool_calls[0])


def test_named_tool_is_called_even_when_off_topic(client: OpenAI) -> None:
    r = _chat(client, ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls] == ["add"]  # a named tool is exactly one call
    _valid(calls[0])


def test_auto_and_none(client: OpenAI) -> None:
    r = _chat(client, ASK, tools=TOOLS, tool_choice="auto", max_tokens=40)
    msg = r.choices[0].message
    if msg.tool_calls:  # the model's choice; whatever it picks must be well-formed
        assert r.choices[0].finish_reason == "tool_calls"
        for call in msg.tool_calls:
            _valid(call)
    else:
        assert msg.content and "<tool_call>" not in msg.content
    r = _chat(client, ASK, tools=TOOLS, tool_choice="none", max_tokens=24)
    assert r.choices[0].message.tool_calls is None and "<tool_call>" not in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streamed_auto_matches_the_plain_response(client: OpenAI) -> None:
    plain = _chat(client, ASK, tools=TOOLS, tool_choice="auto", max_tokens=40)
    stream = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=40,
        stream=True,
    )
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        finish = chunk.choices[0].finish_reason or finish
        content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})
            entry["arguments"] += d.function.arguments or ""
    msg = plain.choices[0].message
    assert finish == plain.choices[0].finish_reason
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in msg.tool_calls or []
    ]
    assert content.strip() == (msg.content or "").strip()


def test_auto_with_a_json_response_format(client: OpenAI) -> None:
    """The Agents SDK's `output_type` with tools: the answer is that JSON, or calls."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    r = _chat(client, ASK, tools=TOOLS, tool_choice="auto", response_format=fmt, max_tokens=40)
    msg = r.choices[0].message
    if msg.tool_calls:
        for call in msg.tool_calls:
            _valid(call)
    else:
        assert r.choices[0].finish_reason == "stop" and set(json.loads(msg.content)) == {"answer"}


def test_parallel_calls(client: OpenAI) -> None:
    messages = [ASK[0], {"role": "user", "content": "Compute 1+2 and 3+4 with two calls of add."}]
    r = _chat(client, messages, tools=[ADD], tool_choice="required", parallel_tool_calls=True, max_tokens=64)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(calls) >= 2 and len({c.id for c in calls}) == len(calls)
    for call in calls:
        _valid(call)
    one = _chat(
        client, messages, tools=[ADD], tool_choice="required", parallel_tool_calls=False, max_tokens=64
    )
    assert len(one.choices[0].message.tool_calls) == 1
    assert one.choices[0].message.tool_calls[0].function.arguments == calls[0].function.arguments


def test_streamed_tool_calls_match_openai_shape(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, finish, usage = [], None, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        finish = chunk.choices[0].finish_reason or finish
        if chunk.choices[0].delta.tool_calls:
            deltas += chunk.choices[0].delta.tool_calls
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name in ("get_weather", "add") and first.function.arguments == ""
    assert rest and all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    arguments = "".join(d.function.arguments for d in rest)
    assert finish == "tool_calls" and usage is not None and usage.completion_tokens > 0
    # the same request without streaming gives the same call (greedy)
    r = _chat(client, ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == (first.function.name, arguments)


def _cached(r: Any) -> int:
    return r.usage.prompt_tokens_details.cached_tokens


def test_multi_turn_with_tool_results_hits_the_cache(client: OpenAI) -> None:
    messages = [ASK[0], {"role": "user", "content": "Weather in Paris? Then add 2 and 3."}]
    turns = []
    for step, choice in enumerate(["get_weather", "add"]):
        r = _chat(
            client, messages, tools=TOOLS, tool_choice={"type": "function", "function": {"name": choice}}
        )
        turns.append(r)
        msg = r.choices[0].message
        call = msg.tool_calls[0]
        _valid(call)
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": ["Sunny, 24 C.", "5"][step]})
    final = _chat(client, messages, tools=TOOLS, tool_choice="auto", max_tokens=24)
    turns.append(final)
    for prev, cur in zip(turns, turns[1:], strict=False):
        assert _cached(cur) >= 0.9 * prev.usage.prompt_tokens
        # the whole previous turn, its generated call included, is reused (all but the last generated
        # token, whose KV is never computed)
        assert _cached(cur) >= prev.usage.prompt_tokens + prev.usage.completion_tokens - 1


def test_re_serialized_history_still_extends_the_cached_prefix(client: OpenAI) -> None:
    """A client that parses and re-dumps arguments (langchain) and sends new ids: rendered canonically."""
    r = _chat(client, ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    redumped = json.dumps(json.loads(call.function.arguments))  # spaces after separators
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "other-id",
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": redumped},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "other-id", "content": "Cloudy."},
    ]
    again = _chat(client, history, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert _cached(again) >= r.usage.prompt_tokens


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools.0",
        ),
        ({"tools": [{"type": "function"}]}, "tools.0"),
        ({"tools": TOOLS, "extra_body": {"regex": "a+"}}, "regex"),
    ],
)
def test_tool_mistakes_are_400_naming_the_field(client: OpenAI, body: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequestError) as err:
        _chat(client, ASK, **body)
    assert err.value.status_code == 400
    assert err.value.body["message"].startswith(field), err.value.body


def test_history_with_malformed_call_is_400(client: OpenAI) -> None:
    bad = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "add", "arguments": "{1"}}],
        },
    ]
    with pytest.raises(BadRequestError) as err:
        _chat(client, bad, tools=TOOLS)
    assert "messages.2.tool_calls.0.function.arguments" in err.value.body["message"]


def test_grammar_keeps_auto_calls_valid_and_none_call_free(engine: Any) -> None:
    """What the model may write, token by token, through the engine's own grammar matcher."""
    from runtime.engine.grammar import GrammarMatcher
    from runtime.errors import GrammarError

    fmt = FORMATS["qwen25"]
    tools = [("get_weather", WEATHER["function"]["parameters"])]

    def feeds(grammar: str, text: str) -> bool:
        matcher = GrammarMatcher.compile(engine.tokenizer, lark=grammar)
        try:
            for token in engine.tokenize(text):
                matcher.accept(token)
        except GrammarError:
            return False
        return True

    auto, none = build(fmt, "auto", tools, True), build(fmt, "none", tools, True)
    good = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Rome","unit":"celsius"}}\n</tool_call>'
    assert feeds(auto, "Let me check. " + good) and feeds(auto, "It is sunny.")
    assert not feeds(auto, '<tool_call>\n{"name":"get_weather","arguments":{"city":1')
    assert not feeds(auto, '<tool_call>\n{"name":"get_time"')
    assert not feeds(auto, '<tool_call>\n{"name":"get_weather","arguments":{"city":"Rome","unit":"kelvin"')
    assert feeds(none, "No tools today <b>") and not feeds(none, "I will call <tool_call>\n{")


def test_required_by_default_is_one_call_and_a_cut_off_call_is_never_text(client: OpenAI) -> None:
    """`required` without parallel_tool_calls: one complete call, finish_reason tool_calls (the
    bundled model repeated its call when a second one was allowed). Cut off by max_tokens: a
    `length` finish, and no half call in `content`."""
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    r = _chat(client, messages, tools=[ADD], tool_choice="required", max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls or []) == 1
    cut = _chat(client, messages, tools=[ADD], tool_choice="required", max_tokens=4)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert not choice.message.content  # not '<tool_call>\n{"name": "add'
