"""Constrained decoding with llguidance: a JSON schema or regex becomes a per-step token mask.

The engine makes one `GrammarMatcher` per constrained request and, at every decode step, asks
`allowed_mask()` before sampling and calls `accept(token)` after. llguidance computes a mask in
~0.1 ms for small schemas; building its tokenizer view costs ~0.3 s, so that is cached per HF
tokenizer object.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

import llguidance
import llguidance.hf
import numpy as np
import torch

from runtime.engine import grammar_guard
from runtime.errors import GrammarError

if TYPE_CHECKING:  # a stub-only TypedDict
    from llguidance._lib import JsonCompileOptions
    from transformers import PreTrainedTokenizerBase

    #: an HF tokenizer, or llguidance's view of one built already
    Tokenizer = PreTrainedTokenizerBase | llguidance.LLTokenizer

# Compact JSON: the model cannot pad with whitespace, which small models otherwise do forever.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


class _TokenizerCache:
    """HF tokenizer -> llguidance LLTokenizer, built once (weakly keyed: dies with the tokenizer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_ref: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, llguidance.LLTokenizer] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, tokenizer: Tokenizer) -> llguidance.LLTokenizer:
        if isinstance(tokenizer, llguidance.LLTokenizer):
            return tokenizer
        with self._lock:
            cached = self._by_ref.get(tokenizer)
            if cached is None:
                try:
                    cached = _ll_tokenizer(tokenizer)
                except ValueError as exc:
                    raise GrammarError(f"tokenizer not supported by llguidance: {exc}") from exc
                self._by_ref[tokenizer] = cached
            return cached


def _ll_tokenizer(tokenizer: PreTrainedTokenizerBase) -> llguidance.LLTokenizer:
    """llguidance's view of an HF tokenizer, with added tokens that are not special (Qwen3's
    `<think>`, `</think>`, `<tool_call>`) as the text they stand for.

    llguidance treats every added token as special (bytes it never matches to text), while its
    forced-text tokenization still produces them: a grammar that spells `<think>` or
    `<tool_call>` was forced onto the added token and then refused it. As byte-level vocabulary
    entries they are ordinary text tokens, which is what the model's tokenizer says they are."""
    import json
    from copy import copy

    if not hasattr(tokenizer, "backend_tokenizer"):
        # a slow tokenizer: llguidance raises ValueError for what it cannot read (GrammarError above)
        return llguidance.hf.from_tokenizer(tokenizer)  # type: ignore[arg-type]
    backend = copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") == "BPE" and isinstance(model.get("vocab"), dict) and _byte_level(spec):
        table = _bytes_to_unicode()
        kept = []
        for tok in spec.get("added_tokens") or []:
            if tok.get("special") or not tok.get("content"):
                kept.append(tok)
                continue
            model["vocab"]["".join(table[b] for b in tok["content"].encode())] = tok["id"]
        spec["added_tokens"] = kept
    return llguidance.LLTokenizer(json.dumps(spec), eos_token=tokenizer.eos_token_id)


def special_literals(lark: str, tokenizer: Tokenizer) -> str:
    """`lark` with each string literal that is exactly one special token's text (Llama 3's
    `"<|python_tag|>"`) written as that token (`<[id]>`): llguidance matches special tokens only
    so, and its forced-text tokenization would otherwise pick the token and then refuse it."""
    import json

    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for token_id, token in added.items():
        text = getattr(token, "content", None)
        if getattr(token, "special", False) and text:
            lark = lark.replace(json.dumps(text, ensure_ascii=False), f"<[{int(token_id)}]>")
    return lark


def _byte_level(spec: dict[str, object]) -> bool:
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    return any(isinstance(p, dict) and p.get("type") == "ByteLevel" for p in parts)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the character BPE vocabularies store it as."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


class GrammarMatcher:
    """Grammar state of one request. Not thread-safe: one decode loop owns it."""

    __slots__ = ("_matcher", "_vocab", "_words", "_bitmask")

    _tokenizers = _TokenizerCache()

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int) -> None:
        self._matcher = matcher
        # vocab: the tokenizer's vocabulary size (the model's may be larger: padded)
        self._words = (vocab + 31) // 32
        self._bitmask = torch.zeros(self._words, dtype=torch.int32)  # [ceil(vocab/32)] reused per step

    @classmethod
    def compile(
        cls,
        tokenizer: Tokenizer,
        json_schema: str | None = None,
        regex: str | None = None,
        ebnf: str | None = None,
        lark: str | None = None,
    ) -> GrammarMatcher:
        """Build a matcher for exactly one of `json_schema` (a JSON string), `regex`, `ebnf` (SGLang's
        field: a GBNF grammar with a `root` rule, or a Lark grammar, as llguidance reads them) or
        `lark` (an llguidance Lark grammar: the tool-calling grammar).

        Raises GrammarError when the constraint is malformed or unsupported.
        """
        if sum(x is not None for x in (json_schema, regex, ebnf, lark)) != 1:
            raise GrammarError("give exactly one of json_schema, regex, ebnf or lark")
        # bounds first (a 400 naming the limit), then native code on a stack far beyond them
        if json_schema is not None:
            grammar_guard.check_json_schema(json_schema)
        elif regex is not None:
            grammar_guard.check_regex(regex)
        elif ebnf is not None:
            grammar_guard.check_ebnf(ebnf)
        ll_tokenizer = cls._tokenizers.get(tokenizer)
        if lark is not None:
            lark = special_literals(lark, tokenizer)
        matcher = grammar_guard.run_with_big_stack(
            lambda: _build(ll_tokenizer, json_schema, regex, ebnf, lark)
        )
        return cls(matcher, ll_tokenizer.vocab_size)

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        """[vocab_size] bool: True where the next token keeps the output inside the grammar.

        Ids beyond the tokenizer's vocabulary (padding rows of the embedding) are never allowed.
        """
        bits = self._bitmask
        self._matcher.unsafe_compute_mask_ptr(bits.data_ptr(), self._words * 4)
        unpacked = np.unpackbits(bits.numpy().view(np.uint8), bitorder="little")
        if vocab_size <= unpacked.shape[0]:
            return torch.from_numpy(unpacked[:vocab_size].astype(bool))
        mask = np.zeros(vocab_size, dtype=bool)
        mask[: unpacked.shape[0]] = unpacked.astype(bool)
        return torch.from_numpy(mask)

    def accept(self, token_id: int) -> None:
        """Advance by one sampled token; a token outside the grammar is a GrammarError."""
        if not self._matcher.consume_token(int(token_id)):
            raise GrammarError(f"constrained decoding failed: {_first_line(self._matcher.get_error())}")

    def is_finished(self) -> bool:
        """True once nothing but end-of-sequence can follow (the constrained text is complete)."""
        return self._matcher.is_stopped()

    def is_accepting(self) -> bool:
        """True when the text so far is a complete match (more tokens may still be allowed)."""
        return self._matcher.is_accepting()

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)


def _build(
    ll_tokenizer: llguidance.LLTokenizer,
    json_schema: str | None,
    regex: str | None,
    ebnf: str | None,
    lark: str | None,
) -> llguidance.LLMatcher:
    try:
        if json_schema is not None:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json_schema, defaults=_JSON_OPTIONS)
        elif ebnf is not None:
            grammar = llguidance.grammar_from("ebnf", ebnf)
        elif lark is not None:
            grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        else:
            grammar = llguidance.LLMatcher.grammar_from_regex(regex)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"bad constraint: {_first_line(str(exc))}") from exc
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"bad constraint: {_first_line(matcher.get_error())}")
    return matcher


def _first_line(message: str) -> str:
    """llguidance appends its parser state (token dumps, counters) after the first line."""
    return message.strip().splitlines()[0][:300] if message.strip() else "rejected by the grammar"
