"""A streamed chat completion (the chat route's own SSE chunks) -> the Responses event stream, as
the tokens come: text, reasoning and each tool call's arguments as deltas, then the final response
with the usage the chat stream ends with. Closing this stream closes the chat stream, which aborts
the engine request (a client gone mid-stream)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.server.openai_stream import chat_chunks
from runtime.server.responses import shape
from runtime.server.responses.stream import Event, EventSequence


def _sse(event: Event) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


@dataclass
class _Turn:
    """Item ids of the one output turn: one message, one reasoning item, one item per call index."""

    message: str = field(default_factory=lambda: shape.new_id("msg"))
    reasoning: str = field(default_factory=lambda: shape.new_id("rs"))
    calls: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    finish: str | None = None
    usage: dict[str, Any] | None = None

    def events(self, seq: EventSequence, choice: dict[str, Any]) -> list[Event]:
        delta = choice.get("delta") or {}
        events: list[Event] = []
        if delta.get("reasoning_content"):
            events += seq.reasoning_delta(delta["reasoning_content"], self.reasoning)
        if delta.get("content"):
            events += seq.text_delta(delta["content"], self.message)
        for call in delta.get("tool_calls") or []:
            index, fn = int(call.get("index", 0)), call.get("function") or {}
            if index not in self.calls:
                self.calls[index] = (shape.new_id("fc"), call["id"], fn["name"])
            events += seq.call_delta(fn.get("arguments") or "", *self.calls[index])
        self.finish = choice.get("finish_reason") or self.finish
        return events


async def events(
    body: AsyncIterable[Any], head: dict[str, Any], on_done: Callable[[dict[str, Any]], None]
) -> AsyncIterator[bytes]:
    """The Responses events for one streamed chat completion; `on_done` gets the final response
    (stored like a non-streamed one) unless the stream failed or was cut off by the client."""
    seq, turn = EventSequence(head), _Turn()
    for event in seq.start():
        yield _sse(event)
    try:
        async for chunk in chat_chunks(body):
            if "error" in chunk:
                for event in seq.failed(str(chunk["error"].get("message", chunk["error"]))):
                    yield _sse(event)
                return
            turn.usage = chunk.get("usage") or turn.usage
            for choice in chunk.get("choices") or []:
                for event in turn.events(seq, choice):
                    yield _sse(event)
    finally:
        close = getattr(body, "aclose", None)
        if close is not None:
            await close()
    status, details = shape.status_of(turn.finish)
    final = seq.finish(status, shape.usage(turn.usage or {}), details)
    on_done(final[-1]["response"])
    for event in final:
        yield _sse(event)
