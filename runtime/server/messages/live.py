"""A streamed chat completion (the chat route's own SSE chunks) -> Anthropic's stream events as the
tokens come: message_start, ping, one content block per thinking / text / tool_use run
(thinking_delta, text_delta, input_json_delta), message_delta (stop reason and the whole usage, which
the client's accumulator takes over message_start's), message_stop. Closing it closes the chat
stream, which aborts the engine request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.server.messages import shape
from runtime.server.openai_stream import chat_chunks


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


@dataclass
class _Blocks:
    """The open content block and the finished ones (the final message, for the ledger)."""

    content: list[dict[str, Any]] = field(default_factory=list)
    kind: str | None = None
    call_index: int | None = None
    args: list[str] = field(default_factory=list)

    def close_open(self) -> list[bytes]:
        if self.kind is None:
            return []
        if self.kind == "tool_use":
            self.content[-1]["input"] = json.loads("".join(self.args) or "{}")
        self.kind, self.call_index, self.args = None, None, []
        return [_event("content_block_stop", {"index": len(self.content) - 1})]

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        events = self.close_open()
        self.kind = kind
        self.content.append(dict(block))
        start = dict(block, input={}) if kind == "tool_use" else block
        events.append(_event("content_block_start", {"index": len(self.content) - 1, "content_block": start}))
        return events

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": len(self.content) - 1, "delta": delta})

    def text(self, kind: str, piece: str) -> list[bytes]:
        key = "thinking" if kind == "thinking" else "text"
        events = (
            []
            if self.kind == kind
            else self._open(kind, {"type": kind, key: ""} | ({"signature": ""} if kind == "thinking" else {}))
        )
        self.content[-1][key] += piece
        events.append(self._delta({"type": f"{key}_delta", key: piece}))
        return events

    def call(self, call: dict[str, Any]) -> list[bytes]:
        index, fn = int(call.get("index", 0)), call.get("function") or {}
        events: list[bytes] = []
        if self.kind != "tool_use" or self.call_index != index:
            events = self._open(
                "tool_use", {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}}
            )
            self.call_index = index
        if fn.get("arguments"):
            self.args.append(fn["arguments"])
            events.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return events

    def choice(self, choice: dict[str, Any]) -> list[bytes]:
        delta = choice.get("delta") or {}
        events: list[bytes] = []
        if delta.get("reasoning_content"):
            events += self.text("thinking", delta["reasoning_content"])
        if delta.get("content"):
            events += self.text("text", delta["content"])
        for call in delta.get("tool_calls") or []:
            events += self.call(call)
        return events


async def events(
    body: AsyncIterable[Any],
    message: dict[str, Any],
    on_done: Callable[[dict[str, Any]], None],
) -> AsyncIterator[bytes]:
    """`message`: the message's id/model/role (and diagnostics, when asked); `on_done` gets the
    final message (for the diagnosis ledger) unless the stream failed or the client left."""
    blocks, finish, matched, usage = _Blocks(), None, None, None
    started = False
    try:
        async for chunk in chat_chunks(body):
            if "error" in chunk:
                error = chunk["error"]
                text = error.get("message", str(error)) if isinstance(error, dict) else str(error)
                yield _event("error", {"error": {"type": "api_error", "message": text}})
                return
            usage = chunk.get("usage") or usage
            if not started and (usage is not None or (chunk.get("choices") or [{}])[0].get("finish_reason")):
                started = True  # message_start carries the prompt's tokens, known with the first token
                for event in _start(message, usage):
                    yield event
            for choice in chunk.get("choices") or []:
                for event in blocks.choice(choice):
                    yield event
                finish = choice.get("finish_reason") or finish
                matched = choice.get("matched_stop", matched)
    finally:
        close = getattr(body, "aclose", None)
        if close is not None:
            await close()
    if not started:
        for event in _start(message, usage):
            yield event
    for event in blocks.close_open():
        yield event
    final = shape.message(message["id"], message["model"], _chat_like(blocks.content, finish, matched, usage))
    final.update({k: v for k, v in message.items() if k not in final})
    on_done(final)
    delta = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
    yield _event("message_delta", {"delta": delta, "usage": final["usage"]})
    yield _event("message_stop", {})


def _start(message: dict[str, Any], usage: dict[str, Any] | None) -> list[bytes]:
    start = dict(message, content=[], stop_reason=None, stop_sequence=None, usage=shape.usage(usage or {}))
    return [_event("message_start", {"message": start}), _event("ping", {})]


def _chat_like(
    content: list[dict[str, Any]], finish: str | None, matched: object, usage: object
) -> dict[str, Any]:
    """The streamed blocks in the shape of a chat body, so the final message is built by the same
    function as a non-streamed one (shape.message)."""
    message: dict[str, Any] = {"content": "".join(b["text"] for b in content if b["type"] == "text")}
    thinking = "".join(b["thinking"] for b in content if b["type"] == "thinking")
    if thinking:
        message["reasoning_content"] = thinking
    calls = [b for b in content if b["type"] == "tool_use"]
    message["tool_calls"] = [
        {"id": b["id"], "function": {"name": b["name"], "arguments": json.dumps(b["input"])}} for b in calls
    ]
    choice = {"message": message, "finish_reason": finish or "stop", "matched_stop": matched}
    return {"choices": [choice], "usage": usage or {}}
