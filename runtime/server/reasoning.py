"""Reasoning output kept apart from the answer (`--reasoning-parser`, SGLang's names).

A parser knows the tags of a family's thinking block and splits an output into
(reasoning, content): whole (`split`, for chat `message.reasoning_content`, a `reasoning` item of
/v1/responses, a `thinking` block of /v1/messages) or as it streams (`ReasoningStream`, for
`delta.reasoning_content`). Any endpoint picks one by name from `PARSERS`.

- `qwen3`: a block only where the output opens one (`<think>`); with `enable_thinking: false`
  Qwen3's template closes an empty block in the prompt and the output is all content.
- `deepseek-r1`: the output starts inside the block whether or not it writes `<think>` (R1's
  template opens it in the generation prompt); everything before `</think>` is reasoning.
- Any parser: a prompt that ends inside an open block (`opened`, e.g. Qwen3-Thinking's template)
  starts the output in reasoning.

As SGLang does, both parts are stripped of surrounding whitespace; an output cut inside the block
(max_tokens) is all reasoning. Streamed parts concatenate to exactly what `split` returns.

Constraints and thinking: `wrap_lark` / `constraint` put an optional thinking block before a
grammar (a regex, JSON schema or tool-call grammar), so a reasoning model thinks first, then
answers or calls under the grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CONTENT, REASONING = "content", "reasoning"


@dataclass(frozen=True, slots=True)
class Split:
    reasoning: str | None  # None: the output has no thinking block
    content: str


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    #: the output begins inside the block even when it does not write `start` (DeepSeek-R1)
    force: bool = False

    def opened(self, prompt: str) -> bool:
        """Whether `prompt` (the rendered chat) ends inside an open thinking block."""
        at = prompt.rfind(self.start)
        return at >= 0 and self.end not in prompt[at:] and not prompt[at + len(self.start) :].strip()

    def split(self, text: str, opened: bool = False) -> Split:
        """(reasoning, content) of a whole output."""
        body = text.lstrip()
        if body.startswith(self.start):
            body = body[len(self.start) :]
        elif not (self.force or opened):
            return Split(None, text)
        if self.end not in body:
            return Split(body.strip(), "")
        reasoning, content = body.split(self.end, 1)
        return Split(reasoning.strip(), content.strip())

    def stream(self, opened: bool = False) -> ReasoningStream:
        return ReasoningStream(self, opened)

    def tag_ids(self, tokenizer: PreTrainedTokenizerBase) -> tuple[int, int] | None:
        """The start and end tags' token ids where each is one token of `tokenizer` (Qwen3's and
        R1's are), else None (the grammar then matches their text)."""
        try:
            ids = [tokenizer.encode(t, add_special_tokens=False) for t in (self.start, self.end)]
        except (AttributeError, TypeError, ValueError):
            return None
        if all(len(i) == 1 for i in ids):
            return ids[0][0], ids[1][0]
        return None

    def block_rules(self, opened: bool, tags: tuple[int, int] | None) -> str:
        """Lark lines for `reasoning_block`: the thinking block up to the first end tag, then
        up to 3 whitespace characters before the answer (Qwen3 writes two newlines). With `tags` (single-token tags) the block is those
        tokens around any tokens but the end tag; else text up to the end tag's first
        occurrence (a lazy lexeme)."""
        gap = "reasoning_gap: /[ \\t\\n]{1,3}/"  # bounded: small models pad whitespace forever
        if tags is not None:
            start = "" if opened else f"<[{tags[0]}]> "
            return f"reasoning_block: {start}reasoning_text <[{tags[1]}]>\nreasoning_text: <[^{tags[1]}]>*\n{gap}"
        start = "" if opened else _regex_literal(self.start)
        end = _regex_literal(self.end)
        return f"reasoning_block[lazy]: /{start}(.|\\n)*{end}/\n{gap}"

    def wrap_lark(self, grammar: str, opened: bool, tags: tuple[int, int] | None = None) -> str:
        """`grammar` (Lark, `start` rule) with a thinking block first (optional unless the prompt
        opened one or the parser forces it)."""
        body = grammar.replace("start:", "reasoning_answer:", 1)
        block = "reasoning_block reasoning_gap? reasoning_answer"
        head = f"start: {block}" if (opened or self.force) else f"start: {block} | reasoning_answer"
        return f"{head}\n{self.block_rules(opened, tags)}\n{body}"

    def constraint(
        self, sampling: dict[str, Any], opened: bool, tags: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """`sampling` with its regex / json_schema / lark constraint applying after the thinking
        block; unchanged without one, or when a regex spells the block itself (`start` in it)."""
        out = dict(sampling)
        if "lark" in out:
            out["lark"] = self.wrap_lark(out["lark"], opened, tags)
        elif "json_schema" in out:
            schema = json.loads(out.pop("json_schema"))
            schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
            out["lark"] = self.wrap_lark("start: %json " + json.dumps(schema), opened, tags)
        elif "regex" in out and self.start not in out["regex"]:
            regex = out.pop("regex").replace("/", "\\/")
            out["lark"] = self.wrap_lark(f"start: ANSWER\nANSWER: /{regex}/", opened, tags)
        return out


def _regex_literal(text: str) -> str:
    """`text` inside a Lark /regex/ (Rust syntax; `<` and `>` stay as they are)."""
    return "".join("\\" + ch if ch in "\\.+*?()|[]{}^$#&-~/" else ch for ch in text)


@dataclass(slots=True)
class ReasoningStream:
    """Splits a streamed output: `feed` the cumulative text, get the new (kind, text) pieces.
    Whitespace a final `split` would strip, and a tag's partial prefix, are held back until
    the text after them decides; `finish` flushes what is left."""

    parser: ReasoningParser
    opened: bool
    sent: dict[str, int] = field(default_factory=lambda: {REASONING: 0, CONTENT: 0})

    def feed(self, text: str) -> list[tuple[str, str]]:
        return self._emit(self._safe(text))

    def finish(self, text: str) -> list[tuple[str, str]]:
        whole = self.parser.split(text, self.opened)
        return self._emit({REASONING: whole.reasoning or "", CONTENT: whole.content})

    def content_so_far(self, text: str) -> str:
        """The content part of `text` as far as it is decided (for a tool-call streamer)."""
        return self._safe(text)[CONTENT]

    def _emit(self, parts: dict[str, str]) -> list[tuple[str, str]]:
        out = []
        for kind in (REASONING, CONTENT):
            new = parts[kind][self.sent[kind] :]
            if new:
                out.append((kind, new))
                self.sent[kind] += len(new)
        return out

    def _safe(self, text: str) -> dict[str, str]:
        p = self.parser
        body = text.lstrip()
        undecided = {REASONING: "", CONTENT: ""}
        if body.startswith(p.start):
            body = body[len(p.start) :]
        elif p.start.startswith(body):  # empty, or a partial start tag
            return undecided
        elif not (p.force or self.opened):
            return {REASONING: "", CONTENT: text}
        if p.end not in body:
            return {REASONING: _hold(body.lstrip(), p.end), CONTENT: ""}
        reasoning, content = body.split(p.end, 1)
        return {REASONING: reasoning.strip(), CONTENT: content.lstrip().rstrip()}


def _hold(text: str, tag: str) -> str:
    """`text` without a trailing partial `tag` and trailing whitespace (both may still change)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            text = text[:-k]
            break
    return text.rstrip()


PARSERS: dict[str, ReasoningParser] = {
    "qwen3": ReasoningParser("qwen3"),
    "deepseek-r1": ReasoningParser("deepseek-r1", force=True),
}


def parser_for(name: str | None) -> ReasoningParser | None:
    """The parser named `name` (None: no parsing). Raises ValueError for an unknown name."""
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"reasoning parser {name!r} is not one of {sorted(PARSERS)}")
    return PARSERS[name]
