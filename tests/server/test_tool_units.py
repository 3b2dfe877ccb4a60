"""Tool calling without the model: formats (parse/render), the streaming splitter, request validation
and the prompt rendering of tool-using history."""

from __future__ import annotations

import json

import pytest

from runtime.server.errors import ApiError
from runtime.server.tools.calls import plan
from runtime.server.tools.formats import FORMATS, RawCall, canonical_json
from runtime.server.tools.prompt import CallMemo, fallback_messages
from runtime.server.tools.stream import ArgsDelta, CallStart, CallStreamer, Content

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}, "city": {"type": "string"}},
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
CALLS = [RawCall("get_weather", '{"city":"Paris","unit":"c"}'), RawCall("add", '{"a":1,"b":2}')]
QWEN = FORMATS["qwen25"]


@pytest.mark.parametrize("name", ["qwen25", "mistral", "llama3"])
def test_render_then_parse_round_trips(name: str) -> None:
    fmt = FORMATS[name]
    text = "Let me look. " + fmt.render_calls(CALLS)
    parsed = fmt.parse(text)
    assert parsed.complete and parsed.content == "Let me look. "
    assert parsed.calls == tuple(CALLS)


def test_parse_keeps_exact_argument_text_and_reports_a_cut_call() -> None:
    text = (
        '<tool_call>\n{"name":"add","arguments":{"b":2.50,"a":1}}\n</tool_call>\n<tool_call>\n{"name":"add"'
    )
    parsed = QWEN.parse(text)
    assert parsed.calls == (RawCall("add", '{"b":2.50,"a":1}'),)
    assert not parsed.complete
    assert QWEN.parse("no calls here <tool_").calls == ()


def test_hermes_shape_matches_sglang_qwen25() -> None:
    assert QWEN.render_calls(CALLS[:1]) == (
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}\n</tool_call>'
    )
    assert FORMATS["hermes"] is QWEN and FORMATS["qwen"] is QWEN


def _stream(fmt_name: str, text: str, step: int) -> list[object]:
    streamer, events = CallStreamer(FORMATS[fmt_name]), []
    for end in range(step, len(text) + step, step):
        events += streamer.feed(text[:end])
    return events + streamer.finish()


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
@pytest.mark.parametrize("name", ["qwen25", "mistral", "llama3"])
def test_streamer_events_rebuild_the_output(name: str, step: int) -> None:
    text = "Sure <b>. " + FORMATS[name].render_calls(CALLS)
    events = _stream(name, text, step)
    content = "".join(e.text for e in events if isinstance(e, Content))
    starts = [e for e in events if isinstance(e, CallStart)]
    args = ["".join(e.text for e in events if isinstance(e, ArgsDelta) and e.index == i) for i in range(2)]
    assert content == "Sure <b>. "
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "add")]
    assert args == [c.arguments for c in CALLS]


def test_streamer_holds_back_a_possible_trigger_and_flushes_plain_text() -> None:
    streamer = CallStreamer(QWEN)
    assert streamer.feed("Hello <tool") == [Content("Hello ")]
    assert streamer.feed("Hello <tooltip>") == [Content("<tooltip>")]
    assert streamer.feed("Hello <tooltip> <") == [Content(" ")]
    assert streamer.finish() == [Content("<")]


def test_plan_validation_names_the_field() -> None:
    fmt = QWEN
    cases = [
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
        (None, "required", "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "allowed_tools", "allowed_tools": {}}, "tool_choice"),
        ([{"type": "custom", "custom": {"name": "x"}}], "auto", "tools.0"),
        ([{"type": "function", "function": {"description": "no name"}}], "auto", "tools.0"),
        ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "tools.0"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "auto",
            "tools.0",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}],
            "auto",
            "tools.0",
        ),
        ([{"type": "function", "function": {"name": "f", "color": "red"}}], "auto", "tools.0"),
        ([WEATHER, WEATHER], "auto", "tools.1.function.name"),
    ]
    for tools, choice, field in cases:
        with pytest.raises(ApiError) as err:
            plan(tools, choice, None, fmt)
        assert err.value.status == 400 and err.value.message.startswith(field), (
            tools,
            choice,
            err.value.message,
        )


def test_plan_defaults() -> None:
    p = plan([WEATHER], None, None, QWEN)
    assert p is not None and p.choice == "auto" and p.parallel
    assert plan(None, "auto", None, QWEN) is None and plan([], "none", None, QWEN) is None
    named = plan([WEATHER, ADD], {"type": "function", "function": {"name": "add"}}, False, QWEN)
    assert named is not None and named.forced == "add" and not named.parallel
    strict = dict(WEATHER, function={**WEATHER["function"], "strict": True})
    assert plan([strict], "required", None, QWEN) is not None


def test_the_same_tools_in_any_order_render_the_same_head() -> None:
    """Issue 35: tools in a canonical order, so a client that reorders them keeps its cache."""
    from runtime.server.tools.prompt import tools_block

    one, other = plan([WEATHER, ADD], "auto", None, QWEN), plan([ADD, WEATHER], "auto", None, QWEN)
    assert one is not None and other is not None
    assert [t.name for t in one.tools] == [t.name for t in other.tools] == ["add", "get_weather"]
    assert tools_block(one.tools, QWEN) == tools_block(other.tools, QWEN)


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and 1+2?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"unit": "c", "city": "Paris"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "3"},
]


def test_history_renders_calls_canonically_and_groups_tool_results() -> None:
    p = plan([WEATHER, ADD], "auto", None, QWEN)
    assert p is not None
    out = fallback_messages(HISTORY, p.tools, QWEN, CallMemo())
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert canonical_json(ADD) in out[0]["content"]  # sorted keys, no spaces
    # re-serialized by the client with spaces and another key order: rendered as the grammar writes it
    assert out[2]["content"] == QWEN.render_calls(CALLS)
    assert (
        out[3]["content"] == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n3\n</tool_response>"
    )
    # the block does not depend on tool_choice / parallel_tool_calls: same head every turn
    other = plan([WEATHER, ADD], "required", False, QWEN)
    assert other is not None and fallback_messages(HISTORY, other.tools, QWEN, CallMemo())[0] == out[0]


def test_memo_restores_the_exact_output_text() -> None:
    memo = CallMemo()
    raw = "Checking. <tool_call>\n" + '{"name":"add","arguments":{"a":1,"b":2.50}}\n</tool_call>'
    memo.record(["call_9"], raw, "Checking.", (RawCall("add", '{"a":1,"b":2.50}'),))
    args = json.dumps({"a": 1, "b": 2.5})  # what a client that parses and re-dumps sends back
    msg = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "add", "arguments": args}}],
    }
    assert fallback_messages([msg], (), QWEN, memo)[0]["content"] == raw
    changed = {**msg, "content": "Something else."}
    assert fallback_messages([changed], (), QWEN, memo)[0]["content"] != raw


def test_history_with_bad_arguments_is_a_400() -> None:
    msg = {
        "role": "assistant",
        "tool_calls": [{"id": "x", "function": {"name": "add", "arguments": "{oops"}}],
    }
    with pytest.raises(ApiError) as err:
        fallback_messages([msg], (), QWEN, CallMemo())
    assert err.value.message.startswith("messages.0.tool_calls.0.function.arguments")


def test_deeply_nested_input_is_a_400_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    msg = {"role": "assistant", "tool_calls": [{"id": "x", "function": {"name": "add", "arguments": deep}}]}
    with pytest.raises(ApiError) as err:
        fallback_messages([msg], (), QWEN, CallMemo())
    assert err.value.status == 400
    params: dict = {"type": "object"}
    for _ in range(5000):
        params = {"type": "object", "properties": {"x": params}}
    with pytest.raises(ApiError) as err:
        plan([{"type": "function", "function": {"name": "f", "parameters": params}}], "auto", None, QWEN)
    assert err.value.status == 400 and err.value.message.startswith("tools.0.function.parameters")


class _TemplateTokenizer:
    """A tokenizer whose chat template takes `tools` (records what it was given)."""

    chat_template = "{% for tool in tools %}{{ tool | tojson }}{% endfor %}"

    def __init__(self) -> None:
        self.seen: dict = {}

    def apply_chat_template(self, messages: list, **kw: object) -> str:
        self.seen = {"messages": messages, **kw}
        return "rendered"


def test_a_template_that_takes_tools_gets_them_sorted_with_parsed_arguments() -> None:
    import asyncio
    from types import SimpleNamespace

    from runtime.server.args import ServerArgs
    from runtime.server.bridge import EngineBridge
    from runtime.server.tools.chat import ToolCalling

    tokenizer = _TemplateTokenizer()
    engine = SimpleNamespace(tokenizer=tokenizer)
    state = SimpleNamespace(engine=engine, args=ServerArgs(), bridge=EngineBridge(engine, 2))
    calling = ToolCalling(state)  # type: ignore[arg-type]
    p = plan([WEATHER], "auto", None, QWEN)
    text, hits = asyncio.run(calling.prompt(HISTORY[:3], p))
    assert (text, hits) == ("rendered", [])  # the template renders history: no memo splices
    assert tokenizer.seen["tools"] == [json.loads(canonical_json(p.tools[0].definition()))]
    assert list(tokenizer.seen["tools"][0]["function"]["parameters"]["properties"]) == ["city", "unit"]
    call = tokenizer.seen["messages"][2]["tool_calls"][0]
    assert call["function"]["arguments"] == {"city": "Paris", "unit": "c"}
