"""The Responses API's streaming event sequence, numbered (`sequence_number`).

Pure builder: the route feeds it (`replay`: a finished response) text and tool-call argument deltas and gets the events to send.
Every opened item is closed with `response.output_item.done`, also a function call cut off by
`max_output_tokens` (then with status "incomplete"), so clients never wait on a dangling item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]


@dataclass
class _Open:
    index: int
    item: dict[str, object]
    text: list[str] = field(default_factory=list)


@dataclass
class EventSequence:
    """Numbers events and tracks the single open output item."""

    response: dict[str, Any]
    _seq: int = 0
    _items: list[dict[str, Any]] = field(default_factory=list)
    _open: _Open | None = None

    def _event(self, kind: str, **body: object) -> Event:
        event = {"type": kind, "sequence_number": self._seq, **body}
        self._seq += 1
        return event

    def start(self) -> list[Event]:
        created = dict(self.response, status="in_progress", output=[])
        return [
            self._event("response.created", response=created),
            self._event("response.in_progress", response=created),
        ]

    def text_delta(self, delta: str, item_id: str) -> list[Event]:
        events = self._ensure_open({"type": "message", "id": item_id, "role": "assistant"})
        assert self._open is not None
        if not self._open.text:
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._part_event("response.content_part.added", part))
        self._open.text.append(delta)
        events.append(self._delta_event("response.output_text.delta", delta))
        return events

    def call_delta(self, delta: str, item_id: str, call_id: str, name: str) -> list[Event]:
        item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name}
        events = self._ensure_open(item)
        assert self._open is not None
        if delta:  # a call's first chunk names it and may carry no arguments yet
            self._open.text.append(delta)
            events.append(self._delta_event("response.function_call_arguments.delta", delta))
        return events

    def reasoning_delta(self, delta: str, item_id: str) -> list[Event]:
        events = self._ensure_open({"type": "reasoning", "id": item_id, "summary": []})
        assert self._open is not None
        self._open.text.append(delta)
        events.append(self._delta_event("response.reasoning_text.delta", delta))
        return events

    def failed(self, message: str) -> list[Event]:
        """An in-band error after the stream began: `error`, then `response.failed`."""
        events = [self._event("error", code="server_error", message=message, param=None)]
        final = dict(self.response, status="failed", output=list(self._items), usage=None)
        final["error"] = {"code": "server_error", "message": message}
        events.append(self._event("response.failed", response=final))
        return events

    def whole_item(self, item: dict[str, object]) -> list[Event]:
        """An item sent finished (a reasoning item split out after generation): added, then done."""
        events = self._close("completed")
        index = len(self._items)
        self._items.append(item)
        events.append(self._event("response.output_item.added", output_index=index, item=item))
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self, status: str, usage: dict[str, object], details: object = None) -> list[Event]:
        events = self._close("completed" if status == "completed" else "incomplete")
        final = dict(self.response, status=status, output=list(self._items), usage=usage)
        final["incomplete_details"] = details
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=final))
        return events

    def _ensure_open(self, item: dict[str, Any]) -> list[Event]:
        if self._open is not None and self._open.item["id"] == item["id"]:
            return []
        events = self._close("completed")
        self._open = _Open(index=len(self._items), item=item)
        added = dict(item, status="in_progress")
        if item["type"] == "function_call":
            added["arguments"] = ""
        if item["type"] == "reasoning":
            added.pop("status")
        events.append(self._event("response.output_item.added", output_index=self._open.index, item=added))
        return events

    def _close(self, status: str) -> list[Event]:
        cur, self._open = self._open, None
        if cur is None:
            return []
        text = "".join(cur.text)
        ids = {"item_id": cur.item["id"], "output_index": cur.index}
        if cur.item["type"] == "function_call":
            done = dict(cur.item, arguments=text, status=status)
            events = [self._event("response.function_call_arguments.done", arguments=text, **ids)]
        elif cur.item["type"] == "reasoning":
            done = dict(cur.item, content=[{"type": "reasoning_text", "text": text}])
            events = [self._event("response.reasoning_text.done", content_index=0, text=text, **ids)]
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            done = dict(cur.item, content=[part], status=status)
            events = [
                self._event("response.output_text.done", content_index=0, text=text, **ids),
                self._event("response.content_part.done", content_index=0, part=part, **ids),
            ]
        self._items.append(done)
        events.append(self._event("response.output_item.done", output_index=cur.index, item=done))
        return events

    def _part_event(self, kind: str, part: dict[str, Any]) -> Event:
        assert self._open is not None
        ids = {"item_id": self._open.item["id"], "output_index": self._open.index}
        return self._event(kind, content_index=0, part=part, **ids)

    def _delta_event(self, kind: str, delta: str) -> Event:
        assert self._open is not None
        ids = {"item_id": self._open.item["id"], "output_index": self._open.index}
        extra = {"content_index": 0} if not kind.startswith("response.function_call") else {}
        return self._event(kind, delta=delta, **ids, **extra)


def replay(response: dict[str, Any]) -> list[Event]:
    """The event sequence of a finished response, ending with the response itself, as stored."""
    head = {k: v for k, v in response.items() if k not in ("output", "usage", "status")}
    seq = EventSequence(head)
    events = seq.start()
    for item in response["output"]:
        if item["type"] == "message":
            events += seq.text_delta(item["content"][0]["text"], item["id"])
        elif item["type"] == "function_call":
            events += seq.call_delta(item["arguments"], item["id"], item["call_id"], item["name"])
        else:
            events += seq.whole_item(item)
    events += seq.finish(response["status"], response["usage"], response["incomplete_details"])
    events[-1]["response"] = response
    return events
