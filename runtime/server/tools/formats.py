"""Tool-call text formats (`--tool-call-parser`, SGLang's names): how calls look in the model's output.

A format is the literal text around a block of calls. Every call inside it is one compact JSON object
`{"name":N,"<args_key>":{...}}`, which is what the grammar (runtime/server/tools/grammar.py) makes the
model write, what `parse` reads back, and what `render_calls` writes into the history of a later turn,
byte for byte (the prefix cache then matches the model's own output).

- `qwen25` (aliases `qwen`, `hermes`): `<tool_call>\\n{...}\\n</tool_call>`, calls separated by a newline.
- `mistral`: `[TOOL_CALLS] [{...}, {...}]`.
- `llama3`: `<|python_tag|>{"name":...,"parameters":{...}}`, calls separated by `;`; read also
  without the tag when the output starts with the call (as Llama 3's own template renders calls),
  and with "arguments" in place of "parameters".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class RawCall:
    """One call as generated: `arguments` is the exact JSON text the model wrote."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Parsed:
    """A model output split into free text and calls. `complete` is False when the text stops inside
    a call (cut by max_tokens or a stop string); the calls before it are kept."""

    content: str
    calls: tuple[RawCall, ...]
    complete: bool


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    begin: str  # opens the block of calls
    call_open: str  # before each call
    call_close: str  # after each call
    sep: str  # between two calls
    end: str  # closes the block
    args_key: str = "arguments"
    response_open: str = "<tool_response>\n"
    response_close: str = "\n</tool_response>"
    #: also read a block written without `begin`, when the output starts with a call's JSON
    #: (Llama 3's template renders its JSON calls so; SGLang's llama3 detector reads both)
    bare: bool = False
    #: another key the arguments may come under (Llama 3 models write "arguments" too)
    alt_args_key: str | None = None

    @property
    def trigger(self) -> str:
        """The text that starts a block of calls (free text before it is the message content)."""
        return self.begin + self.call_open

    def call_head(self, name: str) -> str:
        """A call's JSON up to its arguments: `{"name":"f","arguments":`."""
        return '{"name":' + json.dumps(name, ensure_ascii=False) + f',"{self.args_key}":'

    def render_call(self, call: RawCall) -> str:
        return self.call_open + self.call_head(call.name) + call.arguments + "}" + self.call_close

    def render_calls(self, calls: list[RawCall]) -> str:
        return self.begin + self.sep.join(self.render_call(c) for c in calls) + self.end

    def render_response(self, content: str) -> str:
        return self.response_open + content + self.response_close

    def parse(self, text: str) -> Parsed:
        """Split `text` at the first trigger; read calls until the block ends or the text does."""
        start = text.find(self.trigger)
        if start >= 0:
            content, pos = text[:start], start + len(self.begin)
        elif (
            self.bare
            and text.lstrip().startswith("{")
            and self._one_call(text, len(text) - len(text.lstrip()))
        ):
            content, pos = "", len(text) - len(text.lstrip())
        else:
            return Parsed(text, (), True)
        calls: list[RawCall] = []
        while True:
            step = self._one_call(text, pos)
            if step is None:
                return Parsed(content, tuple(calls), False)
            call, pos = step
            calls.append(call)
            if self.sep and text.startswith(self.sep + self.call_open, pos):
                pos += len(self.sep)
                continue
            rest = text[pos:]
            if rest.startswith(self.end) and not rest[len(self.end) :].strip():
                return Parsed(content, tuple(calls), True)
            return Parsed(content, tuple(calls), False)

    def _one_call(self, text: str, pos: int) -> tuple[RawCall, int] | None:
        if not text.startswith(self.call_open, pos):
            return None
        pos += len(self.call_open)
        try:
            obj, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        name, args = (obj.get("name"), obj.get(self.args_key)) if isinstance(obj, dict) else (None, None)
        key = self.args_key
        if args is None and self.alt_args_key and isinstance(obj, dict):
            args, key = obj.get(self.alt_args_key), self.alt_args_key
        if (
            not isinstance(name, str)
            or not isinstance(args, dict)
            or not text.startswith(self.call_close, end)
        ):
            return None
        raw, head = text[pos:end], self.call_head(name).replace(f'"{self.args_key}":', f'"{key}":')
        # the exact argument text when the call is in the compact form the grammar writes
        arguments = (
            raw[len(head) : -1] if raw.startswith(head) and raw.endswith("}") else canonical_json(args)
        )
        return RawCall(name, arguments), end + len(self.call_close)


def canonical_json(value: object) -> str:
    """The one JSON spelling the grammar lets the model write: sorted keys, no spaces, UTF-8 text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_QWEN = ToolFormat("qwen25", "", "<tool_call>\n", "\n</tool_call>", "\n", "")

FORMATS: dict[str, ToolFormat] = {
    "qwen25": _QWEN,
    "qwen": _QWEN,
    "hermes": _QWEN,
    "mistral": ToolFormat("mistral", "[TOOL_CALLS] [", "", "", ", ", "]"),
    "llama3": ToolFormat(
        "llama3",
        "<|python_tag|>",
        "",
        "",
        ";",
        "",
        args_key="parameters",
        bare=True,
        alt_args_key="arguments",
    ),
}

DEFAULT_FORMAT = "qwen25"
