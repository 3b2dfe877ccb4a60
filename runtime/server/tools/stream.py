"""Incremental split of a streamed output into content deltas and OpenAI `delta.tool_calls` events.

Fed the cumulative text after every engine chunk. Text that could still become the format's trigger
is held back (never sent as content, then retracted). Inside a call, the first event carries the
name (sent once the name's JSON string is closed), then the arguments' text in fragments exactly as
generated: the fragments of a call concatenate to its final `function.arguments`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from runtime.server.tools.formats import ToolFormat


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ArgsDelta:
    index: int
    text: str


Event = Content | CallStart | ArgsDelta


class CallStreamer:
    """Not thread-safe: one stream owns it. Modes: text -> head -> args -> after -> head ... -> done."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.pos = 0
        self.mode = "text"
        self.calls = 0
        self._depth = 0
        self._in_str = False
        self._escaped = False

    def feed(self, text: str) -> list[Event]:
        self.text = text
        events: list[Event] = []
        while True:
            step = getattr(self, f"_{self.mode}")()
            if not step:
                return events
            events.extend(e for e in step if not isinstance(e, bool))

    def finish(self) -> list[Event]:
        """Flush what was held back; text after calls that were cut short stays unsent."""
        if self.mode == "text" and self.pos < len(self.text):
            rest, self.pos = self.text[self.pos :], len(self.text)
            return [Content(rest)]
        return []

    # Each mode step returns None (needs more text) or a list of events (possibly [True]: progressed).
    def _text(self) -> list | None:
        trig = self.fmt.trigger
        idx = self.text.find(trig, self.pos)
        if idx >= 0:
            before, self.pos, self.mode = self.text[self.pos : idx], idx + len(self.fmt.begin), "head"
            return [Content(before)] if before else [True]
        hold = _held_back(self.text, trig, self.pos)
        upto = len(self.text) - hold
        if upto > self.pos:
            out, self.pos = self.text[self.pos : upto], upto
            return [Content(out)]
        return None

    def _head(self) -> list | None:
        lead = self.fmt.call_open + '{"name":'
        rest = self.text[self.pos :]
        if len(rest) < len(lead):
            return self._mismatch(rest, lead)
        if not rest.startswith(lead):
            return self._mismatch(rest, lead)
        end = _string_end(rest, len(lead))
        if end is None:
            return None
        tail = f',"{self.fmt.args_key}":'
        if not rest.startswith(tail, end):
            return self._mismatch(rest[end:], tail)
        name = json.loads(rest[len(lead) : end])
        self.pos += end + len(tail)
        self.mode, self._depth, self._in_str, self._escaped = "args", 0, False, False
        return [CallStart(self.calls, name)]

    def _args(self) -> list | None:
        start, i = self.pos, self.pos
        while i < len(self.text):
            ch = self.text[i]
            i += 1
            if self._in_str:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.mode = "after"
                    break
        if i == start:
            return None
        self.pos = i
        return [ArgsDelta(self.calls, self.text[start:i])]

    def _after(self) -> list | None:
        close = "}" + self.fmt.call_close
        rest = self.text[self.pos :]
        if not rest.startswith(close):
            return None if close.startswith(rest) else self._done()
        nxt = self.fmt.sep + self.fmt.call_open
        more = rest[len(close) :]
        if self.fmt.sep and more.startswith(nxt):
            self.pos += len(close) + len(self.fmt.sep)
            self.calls, self.mode = self.calls + 1, "head"
            return [True]
        if self.fmt.sep and nxt.startswith(more):
            return None  # could still be a separator
        self.calls += 1
        return self._done()

    def _done(self) -> list | None:
        self.mode = "done"
        return None

    def _mismatch(self, rest: str, expected: str) -> list | None:
        # a prefix of what must come: wait for more; anything else: the block is over (the grammar
        # never lets it happen; unconstrained text simply ends the calls)
        return None if expected.startswith(rest) else self._done()


def _held_back(text: str, trigger: str, pos: int) -> int:
    """Length of the longest suffix of text[pos:] that is a proper prefix of `trigger`."""
    for k in range(min(len(trigger) - 1, len(text) - pos), 0, -1):
        if text.endswith(trigger[:k]):
            return k
    return 0


def _string_end(text: str, start: int) -> int | None:
    """Index just past the JSON string starting at text[start] (a quote), None when not closed yet."""
    if start >= len(text) or text[start] != '"':
        return None
    i, escaped = start + 1, False
    while i < len(text):
        ch = text[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return i + 1
        i += 1
    return None
