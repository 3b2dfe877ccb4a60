"""Assistant turns sent back in a later request, rendered so the prefix cache still holds them.

Chat templates re-render the history on every request, and reasoning templates rewrite earlier
turns: Qwen3's drops the `<think>` block of every assistant turn before the last user message,
so from the second user turn on, the prompt stops extending the previous prompt + output at the
first assistant turn and everything after it is computed again.

`--reasoning-history preserve` (the default): every generated turn is remembered (`TurnMemo`:
its exact output text, output tokens, and the generation prompt the template ended with). A
turn sent back (same reasoning, content and tool calls) is rendered as generated: the template
renders a marker in its place, and the marker with the assistant header before it is replaced
by that generation prompt and the output text; its tokens are the very tokens generated.

`--reasoning-history template`: the template's own rendering. Where it drops or rewrites an
assistant turn's reasoning, `rewrites` names each one (message index, the dropped span), and
the trace counts the tokens lost as the miss cause `template_rewrite` (runtime/trace/ledger.py).
"""

from __future__ import annotations

import contextvars
import functools
import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from runtime.server.reasoning import ReasoningParser
from runtime.server.turn_records import captured
from runtime.trace.ledger import RewriteNote

HISTORY_MODES = ("preserve", "template")

#: the rewrites of the request being served (read by the trace, runtime/server/trace_dir.py)
TEMPLATE_REWRITES: contextvars.ContextVar[tuple[Rewrite, ...]] = contextvars.ContextVar(
    "template_rewrites", default=()
)


@dataclass(frozen=True, slots=True)
class Rewrite:
    """The template did not render assistant message `message` as generated; `dropped` is the
    text it left out (its reasoning, when that is what went)."""

    message: int
    dropped: str

    def as_dict(self) -> RewriteNote:
        return {"message": self.message, "dropped": self.dropped[:200]}


@dataclass(frozen=True, slots=True)
class Turn:
    text: str  # the output text as generated (thinking block, content, calls)
    output_ids: tuple[int, ...] | None  # its tokens, when they decode to exactly `text`
    gen_prompt: str  # what the template appended for the generation prompt


@dataclass(frozen=True, slots=True)
class Span:
    """Where a restored turn sits in the final prompt text, and its tokens."""

    start: int
    end: int
    output_ids: tuple[int, ...] | None


def turn_key(message: dict[str, Any], parser: ReasoningParser | None, salt: str | None = None) -> str:
    """What identifies an assistant turn as sent back: reasoning, content and calls, stripped,
    under the request's cache salt (a tenant never gets another's generated text or tokens)."""
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content")
    if reasoning is None and parser is not None:
        split = parser.split(content)
        reasoning, content = split.reasoning, split.content
    calls = [
        [(c.get("function") or {}).get("name"), _args((c.get("function") or {}).get("arguments"))]
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return json.dumps([salt, (reasoning or "").strip(), content.strip(), calls], sort_keys=True)


def _args(arguments: object) -> object:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments


class TurnMemo:
    """Generated assistant turns by `turn_key` (bounded, least recently used dropped)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[str, Turn] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def record(self, keys: list[str], turn: Turn) -> None:
        with self._lock:
            for key in keys:
                self._items[key] = turn
                self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        captured(functools.partial(self.record, keys, turn), turn.text, turn.output_ids)

    def lookup(self, key: str) -> Turn | None:
        with self._lock:
            turn = self._items.get(key)
            if turn is not None:
                self._items.move_to_end(key)
            return turn


def substitute(
    messages: list[dict[str, Any]], memo: TurnMemo, parser: ReasoningParser | None, salt: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Turn]]:
    """`messages` with every remembered assistant turn replaced by a marker message; the
    markers' turns (`restore` puts them back into the rendered text)."""
    out, marks = [], {}
    for msg in messages:
        turn = memo.lookup(turn_key(msg, parser, salt)) if msg.get("role") == "assistant" else None
        if turn is None:
            out.append(msg)
            continue
        marker = f"\u2063turn-{uuid.uuid4().hex}\u2063"
        marks[marker] = turn
        out.append({"role": "assistant", "content": marker})
    return out, marks


def restore(text: str, marks: dict[str, Turn]) -> tuple[str, list[Span]]:
    """Each marker, with the assistant header the template put before it, replaced by the turn's
    generation prompt and output text. Returns the text and the restored spans (in order)."""
    spans: list[Span] = []
    for marker, turn in marks.items():
        at = text.find(marker)
        if at < 0:  # the template dropped the turn entirely: nothing to restore
            continue
        before = text[:at]
        k = _overlap(before, turn.gen_prompt)
        head = before[: len(before) - k] + turn.gen_prompt
        text = head + turn.text + text[at + len(marker) :]
        spans.append(Span(len(head), len(head) + len(turn.text), turn.output_ids))
    spans.sort(key=lambda s: s.start)
    return text, spans


def _overlap(before: str, gen_prompt: str) -> int:
    """The longest end of `before` that begins `gen_prompt` (the assistant header)."""
    for k in range(min(len(before), len(gen_prompt)), 0, -1):
        if before.endswith(gen_prompt[:k]):
            return k
    return 0


def rewrites(
    messages: list[dict[str, Any]],
    text: str,
    memo: TurnMemo,
    parser: ReasoningParser | None,
    salt: str | None = None,
) -> tuple[Rewrite, ...]:
    """Assistant turns the rendered `text` does not hold as generated: their reasoning missing,
    or (remembered turns) their generated text missing."""
    found = []
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        reasoning = msg.get("reasoning_content")
        if reasoning is None and parser is not None:
            reasoning = parser.split(msg.get("content") or "").reasoning
        turn = memo.lookup(turn_key(msg, parser, salt))
        if turn is not None:
            if turn.text not in text:
                found.append(Rewrite(i, _block(turn.text, parser)))
        elif reasoning and reasoning.strip() not in text:
            found.append(Rewrite(i, reasoning.strip()))
    return tuple(found)


def _block(generated: str, parser: ReasoningParser | None) -> str:
    """The thinking block of a generated turn (what reasoning templates drop), else all of it."""
    if parser is not None and parser.end in generated:
        return generated[: generated.index(parser.end) + len(parser.end)].strip()
    return generated
