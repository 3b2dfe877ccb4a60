"""`diagnostics.previous_message_id` -> `cache_miss_reason`, answered from a bounded per-tenant ledger
of what each message id was built from (model, system, tools, messages, prompt tokens)."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

from runtime.server.messages.models import MessagesRequest

CAPACITY = 4096  # message ids remembered per server (oldest forgotten first)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Record:
    tenant: str
    model: str
    system: str
    tools: str
    turns: tuple[str, ...]  # digest of each message, the reply included
    prompt_tokens: int


class DiagLedger:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.records: OrderedDict[str, Record] = OrderedDict()

    def remember(
        self, msg_id: str, tenant: str, req: MessagesRequest, reply: dict[str, object], tokens: int
    ) -> None:
        turns = [m.model_dump() for m in req.messages] + [{"role": "assistant", "content": reply["content"]}]
        self.records[msg_id] = Record(
            tenant,
            req.model,
            _digest(req.system),
            _digest(req.tools),
            tuple(_digest(t) for t in turns),
            tokens,
        )
        while len(self.records) > self.capacity:
            self.records.popitem(last=False)

    def diagnose(self, tenant: str, req: MessagesRequest, prompt: int, cached: int) -> dict[str, object]:
        prev_id = req.diagnostics.previous_message_id if req.diagnostics else None
        prev = self.records.get(prev_id or "")
        if prev is None or prev.tenant != tenant:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        missed = max(0, min(prev.prompt_tokens, prompt) - cached)
        reason = self._reason(prev, req)
        if reason is None:
            return {"cache_miss_reason": None, "radixagent": {"cache_missed_input_tokens": missed}}
        return {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}

    @staticmethod
    def _reason(prev: Record, req: MessagesRequest) -> str | None:
        if prev.model != req.model:
            return "model_changed"
        if prev.system != _digest(req.system):
            return "system_changed"
        if prev.tools != _digest(req.tools):
            return "tools_changed"
        now = tuple(_digest(m.model_dump()) for m in req.messages)
        # the previous prompt minus its reply must be a prefix of this one
        if now[: len(prev.turns) - 1] != prev.turns[:-1]:
            return "messages_changed"
        return None
