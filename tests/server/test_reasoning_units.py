"""The reasoning parsers (runtime/server/reasoning.py) without a model: whole and streamed
splits agree for every cut of the text, and the registry's SGLang names."""

from __future__ import annotations

import pytest

from runtime.server.reasoning import PARSERS, Split, parser_for

CASES = [
    ("qwen3", False, "<think>\nplan a\n</think>\n\nHello there \n", Split("plan a", "Hello there")),
    ("qwen3", False, "Hello <think>not a block</think>", Split(None, "Hello <think>not a block</think>")),
    ("qwen3", False, "<think>cut short by max_tokens", Split("cut short by max_tokens", "")),
    ("qwen3", True, "plan</think>Hi", Split("plan", "Hi")),  # the prompt opened the block
    ("deepseek-r1", False, "plan</think>\nHi", Split("plan", "Hi")),  # R1's template opens it
    ("deepseek-r1", False, "<think>plan</think>Hi", Split("plan", "Hi")),
    ("qwen3", False, "<think></think>\n\n<tool_call>\n{}", Split("", "<tool_call>\n{}")),
]


@pytest.mark.parametrize("name,opened,text,expected", CASES)
def test_split_and_every_streamed_cut_agree(name, opened, text, expected):
    parser = PARSERS[name]
    assert parser.split(text, opened) == expected
    for step in (1, 2, 3, 7):
        stream = parser.stream(opened)
        parts = {"reasoning": "", "content": ""}
        for end in range(step, len(text) + step, step):
            for kind, piece in stream.feed(text[:end]):
                parts[kind] += piece
        for kind, piece in stream.finish(text):
            parts[kind] += piece
        assert parts == {"reasoning": expected.reasoning or "", "content": expected.content}, step


def test_opened_prompts():
    p = PARSERS["qwen3"]
    assert p.opened("<|im_start|>assistant\n<think>\n")
    assert not p.opened("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking false
    assert not p.opened("<|im_start|>assistant\n")


def test_registry_names():
    assert sorted(PARSERS) == ["deepseek-r1", "qwen3"]
    assert parser_for(None) is None
    with pytest.raises(ValueError, match="reasoning parser 'glm45'"):
        parser_for("glm45")


def test_constraints_wrap_after_the_block():
    p = PARSERS["qwen3"]
    wrapped = p.constraint({"regex": "a/b"}, opened=False, tags=(7, 8))
    assert "regex" not in wrapped and "<[7]> reasoning_text <[8]>" in wrapped["lark"]
    assert "/a\\/b/" in wrapped["lark"]
    assert p.constraint({"regex": "<think>x</think>y"}, opened=False) == {"regex": "<think>x</think>y"}
    assert p.constraint({"temperature": 0}, opened=False) == {"temperature": 0}
    forced = PARSERS["deepseek-r1"].wrap_lark("start: A\nA: /x/", opened=True, tags=None)
    assert forced.startswith("start: reasoning_block reasoning_gap? reasoning_answer\n")
