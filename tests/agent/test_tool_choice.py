"""tool_choice, worked examples in the head and degenerate-argument guards (scripted model)."""

from __future__ import annotations

import json
import re

import pytest

from agent import Agent, Example, action_schema, tool
from agent.choice import allowed_actions, named_in_task
from agent.constraints import not_words_pattern, span_pattern
from tests.support.behaviour import SYSTEM, add, multiply
from tests.support.fake_backend import FakeBackend


def _answer(_call) -> str:
    return '{"answer":"42"}'


def _branches(call) -> list[str]:
    schema = json.loads(call.sampling_params["json_schema"])
    return [
        b["properties"].get("tool", {}).get("const") or next(iter(b["properties"])) for b in schema["anyOf"]
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", ["add", "multiply", "answer", "dead_end"]),
        ("required", ["add", "multiply"]),
        ("none", ["answer", "dead_end"]),
        ("multiply", ["multiply"]),
    ],
)
def test_tool_choice_sets_the_first_actions_grammar(choice, expected):
    backend = FakeBackend(['{"tool":"multiply","arguments":{"a":2,"b":3}}', '{"answer":"6"}'])
    if choice == "none":
        backend = FakeBackend(['{"answer":"6"}'])
    result = Agent(backend, system=SYSTEM, tools=[add, multiply], tool_choice=choice).run(
        "What is 2 times 3?"
    )
    assert _branches(backend.calls[0]) == expected
    if len(backend.calls) > 1:  # after the first call the model may answer again
        assert "answer" in _branches(backend.calls[1])
    assert result.answer == "6"


def test_per_run_tool_choice_overrides_the_agent():
    backend = FakeBackend(['{"answer":"6"}'])
    agent = Agent(backend, system=SYSTEM, tools=[add, multiply])
    agent.run("What is 2 times 3?", tool_choice="none")
    assert _branches(backend.calls[0]) == ["answer", "dead_end"]


def test_task_naming_a_tool_forces_that_tool_first():
    backend = FakeBackend(['{"tool":"multiply","arguments":{"a":7,"b":4}}', '{"answer":"28"}'])
    agent = Agent(backend, system=SYSTEM, tools=[add, multiply])
    result = agent.run("A pen costs 4 dollars. Use the multiply tool to price 7 pens.")
    assert _branches(backend.calls[0]) == ["multiply"]
    assert result.trace[0].tool["result"] == "28" and result.answer == "28"


@pytest.mark.parametrize(
    ("task", "named"),
    [
        ("Use the multiply tool to price it", ("multiply",)),
        ("please call `add` on 2 and 3", ("add",)),
        ("using lookup price, find it", ("lookup_price",)),
        ("What is 2 + 3?", ()),
        ("I added milk and multiplied", ()),
        ("use add or multiply", ("add", "multiply")),
    ],
)
def test_named_in_task(task, named):
    assert named_in_task(task, ["add", "multiply", "lookup_price"]) == named


def test_allowed_actions_after_the_first_call_may_answer():
    assert allowed_actions("required", "x", ["a"], first=False).answer
    assert allowed_actions("a", "x", ["a", "b"], first=True).tools == ("a",)


@pytest.mark.parametrize("bad", ["sometimes", "divide", ""])
def test_bad_tool_choice_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="tool_choice"):
        Agent(FakeBackend([]), tools=[add], tool_choice=bad)
    with pytest.raises(ValueError, match="tool_choice"):
        Agent(FakeBackend([]), tools=[add]).start("x", tool_choice=bad or "nope")
    with pytest.raises(ValueError, match="needs at least one tool"):
        Agent(FakeBackend([]), tool_choice="required")


def test_examples_are_demonstrated_turns_in_one_stable_head():
    example = Example("What is 2 + 5?", "7", (("add", {"a": 2, "b": 5}, "7"),))
    backend = FakeBackend(['{"answer":"9"}', '{"answer":"9"}'])
    agent = Agent(backend, system=SYSTEM, tools=[add], examples=[example])
    agent.run("What is 4 + 5?")
    agent.run("What is 3 + 6?")
    first, second = backend.calls[0].prompt, backend.calls[1].prompt
    demo = (
        '<|im_start|>user\nWhat is 2 + 5?<|im_end|>\n<|im_start|>assistant\n{"tool":"add","arguments":{"a":2,"b":5}}'
        "<|im_end|>\n<|im_start|>user\nObservation [call_0]: 7"
    )
    assert demo in first and first.index(demo) < first.index("What is 4 + 5?")
    head = first[: first.index("What is 4 + 5?")]
    assert second.startswith(head)  # every example prefilled once, shared by later runs
    assert backend.calls[1].cached_tokens >= len(backend.tokenize(head)) - 1


def test_examples_must_call_known_tools():
    with pytest.raises(ValueError, match="unknown tool"):
        Agent(FakeBackend([]), tools=[add], examples=[Example("q", "a", (("divide", {}, "1"),))])


def test_tool_examples_join_the_head():
    @tool(examples=[Example("Price of 3 pens at 2 dollars?", "6", (("times", {"a": 3, "b": 2}, "6"),))])
    def times(a: float, b: float) -> float:
        """Multiply two numbers."""
        return a * b

    backend = FakeBackend(['{"answer":"6"}'])
    Agent(backend, system=SYSTEM, tools=[times]).run("Price of 4 pens?", tool_choice="none")
    assert '{"tool":"times","arguments":{"a":3,"b":2}}' in backend.calls[0].prompt


def test_string_arguments_refuse_the_tools_own_name_and_empty():
    @tool
    def search_document(query: str, mode: str = "all") -> str:
        """Search."""
        return query

    schema = json.loads(action_schema([search_document]))
    pattern = schema["anyOf"][0]["properties"]["arguments"]["properties"]["query"]["pattern"]
    for bad in ["search_document", "Search Document", "searchdocument", "query", "", " leading space"]:
        assert not re.fullmatch(pattern.strip("^$"), bad), bad
    for good in ["secret code orange door", "search", "document", "queries"]:
        assert re.fullmatch(pattern.strip("^$"), good), good
    assert pattern == not_words_pattern(
        ["search_document", "search document", "searchdocument", "query", "mode"]
    )


def test_span_pattern_allows_verbatim_spans_only():
    pattern = span_pattern(["The secret code of the orange door is 2965."], extra=["not found"])
    for good in ["2965", "orange door is 2965", "The secret code", "not found"]:
        assert re.fullmatch(pattern.strip("^$"), good), good
    for bad in ["door 2965", "2965.", "the code", ""]:
        assert not re.fullmatch(pattern.strip("^$"), bad), bad


def test_numeric_arguments_take_numbers_written_in_the_run():
    backend = FakeBackend(['{"tool":"multiply","arguments":{"a":7,"b":4}}', '{"answer":"28"}'])
    agent = Agent(backend, system="Shop. Delivery costs 3 dollars.", tools=[add, multiply])
    agent.run("A notebook costs 4.50 dollars. Use the multiply tool to price 7 notebooks.")
    first = json.loads(backend.calls[0].sampling_params["json_schema"])["anyOf"][0]
    assert first["properties"]["arguments"]["properties"]["a"]["enum"] == [3, 7]  # integers only
    second = json.loads(backend.calls[1].sampling_params["json_schema"])["anyOf"][0]
    assert second["properties"]["arguments"]["properties"]["b"]["enum"] == [3, 7, 4, 28]  # + call, result
    off = FakeBackend(['{"answer":"x"}'])
    Agent(off, system=SYSTEM, tools=[add], ground_numbers=False).run("What is 1 + 2?")
    assert "enum" not in off.calls[0].sampling_params["json_schema"]


def test_protocol_examples_fill_an_empty_head_and_can_be_turned_off():
    from agent.examples import PROTOCOL_EXAMPLES, render_examples

    backend = FakeBackend(['{"answer":"9"}', '{"answer":"9"}'])
    Agent(backend, system=SYSTEM, tools=[add]).run("What is 4 + 5?")
    Agent(backend, system=SYSTEM, tools=[add], examples=()).run("What is 4 + 5?")
    demos = render_examples(PROTOCOL_EXAMPLES)
    assert demos in backend.calls[0].prompt  # call -> observation -> answer, before the task
    assert backend.calls[0].prompt.index(demos) < backend.calls[0].prompt.index("What is 4 + 5?")
    assert "get_weather" not in backend.calls[1].prompt  # examples=() opts out


def test_protocol_examples_skip_a_tool_name_the_agent_has():
    @tool
    def get_weather(city: str) -> str:
        """Weather now."""
        return "sunny"

    backend = FakeBackend(['{"answer":"sunny"}'])
    Agent(backend, system=SYSTEM, tools=[get_weather]).run("Weather in Rome?")
    prompt = backend.calls[0].prompt
    assert '"arguments":{"city":"Oslo"}' not in prompt and '{"tool":"times"' in prompt


def test_the_last_allowed_call_can_only_answer():
    calls = ['{"tool":"add","arguments":{"a":2,"b":3}}', '{"tool":"add","arguments":{"a":5,"b":3}}']
    backend = FakeBackend([*calls, '{"answer":"5"}'])
    result = Agent(backend, system=SYSTEM, tools=[add], max_steps=3).run("What is 2 + 3?")
    assert "add" in _branches(backend.calls[1]) and _branches(backend.calls[2]) == ["answer", "dead_end"]
    assert result.status == "answered" and result.answer == "5"


def test_argument_schemas_replace_a_tools_own_for_one_call():
    import json

    from agent import tool
    from agent.actions import action_schema

    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return query

    narrowed = {
        "type": "object",
        "properties": {"query": {"type": "string", "enum": ["tea", "cake"]}},
        "required": ["query"],
        "additionalProperties": False,
    }
    schema = json.loads(action_schema([lookup], arguments={"lookup": narrowed}))
    call = next(b for b in schema["anyOf"] if "tool" in b["properties"])
    assert call["properties"]["arguments"]["properties"]["query"] == {
        "type": "string",
        "enum": ["tea", "cake"],
    }
    plain = json.loads(action_schema([lookup]))
    own = next(b for b in plain["anyOf"] if "tool" in b["properties"])
    assert "pattern" in own["properties"]["arguments"]["properties"]["query"]  # the guarded default
