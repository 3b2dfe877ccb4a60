"""Messages stream events from a finished message: message_start (with the real input tokens),
one content block per block (text_delta / thinking_delta / input_json_delta), message_delta,
message_stop, with a ping after the start."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    kind = block["type"]
    start: dict[str, Any]
    if kind == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        delta = {"type": "thinking_delta", "thinking": block["thinking"]}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [
        _event(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        ),
        _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
        _event("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


async def events(message: dict[str, Any]) -> AsyncIterator[bytes]:
    usage = message["usage"]
    start = dict(message, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = dict(usage, output_tokens=0)
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})
    for i, block in enumerate(message["content"]):
        for chunk in _block_events(i, block):
            yield chunk
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield _event("message_stop", {"type": "message_stop"})
