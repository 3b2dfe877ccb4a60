"""Render-parse round trips: each `--tool-call-parser` reads the tool calls its family's own chat
template writes into the history (tests/fixtures/templates: Qwen3's hermes-style `<tool_call>`,
Llama 3's bare JSON with "parameters"), and the tool results come out as the format renders them."""

from __future__ import annotations

import json

import pytest

from runtime.server.tools.formats import FORMATS
from tests.families import family_tokenizer

pytestmark = pytest.mark.slow  # the bundled tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documents.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]
CALLS = [
    ("search_docs", {"query": 'radix "trees" über alles', "limit": 3, "filters": {"year": [2024, 2025]}}),
    ("get_time", {}),
]


def _history(calls: list, content: str | None) -> list[dict]:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls)
    ]
    results = [
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"result {i}"} for i in range(len(calls))
    ]
    return [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Find radix trees."},
        {"role": "assistant", "content": content, "tool_calls": tool_calls},
        *results,
    ]


def _between(text: str, head: str, tail: str) -> str:
    start = text.index(head) + len(head)
    return text[start : text.index(tail, start)]


@pytest.mark.parametrize("parser", ["qwen25", "qwen", "hermes"])
@pytest.mark.parametrize("content", [None, "Let me look."])
def test_hermes_parsers_read_qwen3_template_calls(parser, content):
    tok = family_tokenizer("qwen3")
    text = tok.apply_chat_template(_history(CALLS, content), tools=TOOLS, tokenize=False)
    segment = _between(text, "<|im_start|>assistant\n", "<|im_end|>")
    parsed = FORMATS[parser].parse(segment)
    assert parsed.complete
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == CALLS
    assert parsed.content.strip() == (content or "")
    for i in range(len(CALLS)):  # the results as the format renders them, in the tool turn
        assert FORMATS[parser].render_response(f"result {i}") in text


def test_qwen3_template_holds_our_rendering_of_the_calls():
    """The calls as the grammar makes the model write them parse back the same (the other way
    round: what we generate is what the template's history then holds, modulo JSON spacing)."""
    fmt = FORMATS["qwen25"]
    ours = fmt.parse(fmt.render_calls([fmt.parse(c).calls[0] for c in _rendered_calls()]))
    assert [(c.name, json.loads(c.arguments)) for c in ours.calls] == CALLS


def _rendered_calls() -> list[str]:
    tok = family_tokenizer("qwen3")
    text = tok.apply_chat_template(_history(CALLS, None), tools=TOOLS, tokenize=False)
    segment = _between(text, "<|im_start|>assistant\n", "<|im_end|>")
    return [f"<tool_call>{part}" for part in segment.split("<tool_call>")[1:]]


def test_llama3_parser_reads_llama3_template_calls():
    tok = family_tokenizer("llama3")
    call = [CALLS[0]]  # Llama 3's template takes one call per turn
    text = tok.apply_chat_template(_history(call, None), tools=TOOLS, tokenize=False)
    segment = _between(text, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")
    assert not segment.startswith("<|python_tag|>")  # the template writes bare JSON
    parsed = FORMATS["llama3"].parse(segment)
    assert parsed.complete and [(c.name, json.loads(c.arguments)) for c in parsed.calls] == call
    tagged = FORMATS["llama3"].parse('<|python_tag|>{"name": "get_time", "arguments": {}}')
    assert [(c.name, json.loads(c.arguments)) for c in tagged.calls] == [("get_time", {})]
    assert FORMATS["llama3"].parse("Plain {answer}").calls == ()
