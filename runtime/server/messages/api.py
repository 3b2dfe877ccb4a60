"""Routes: POST /v1/messages and POST /v1/messages/count_tokens, served through the chat path."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.server.messages import live, shape, stream
from runtime.server.messages.diag import DiagLedger
from runtime.server.messages.models import CountTokensRequest, MessagesRequest
from runtime.server.messages.translate import chat_request
from runtime.server.reasoning_chat import ReasoningChat
from runtime.server.schemas import ChatCompletionRequest, StreamOptions
from runtime.server.state import ServerState
from runtime.server.tools.chat import ToolCalling

Chat = Callable[[ChatCompletionRequest, Request], Awaitable[Response]]


def _tenant(request: Request) -> str:
    key = request.headers.get("x-api-key") or request.headers.get("authorization") or ""
    return hashlib.sha256(key.encode()).hexdigest()


def _salted(creq: ChatCompletionRequest, request: Request) -> ChatCompletionRequest:
    """With a key, the key's digest is the cache namespace: tenants never share prefixes."""
    if request.headers.get("x-api-key") or request.headers.get("authorization"):
        creq.cache_salt = f"key-{_tenant(request)[:32]}"
    return creq


def messages_router(
    state: ServerState, chat: Chat, tools: ToolCalling, reasoning: ReasoningChat
) -> APIRouter:
    r = APIRouter()
    ledger = DiagLedger()

    @r.post("/v1/messages")
    async def create(req: MessagesRequest, request: Request) -> Response:
        creq = _salted(chat_request(req), request)
        tenant = _tenant(request)
        asks_diagnosis = req.diagnostics is not None and req.diagnostics.previous_message_id is not None
        if req.stream and not asks_diagnosis:  # the diagnosis needs the usage before message_start
            creq.stream = True
            creq.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)
            answer = await chat(creq, request)
            assert isinstance(answer, StreamingResponse)
            head = {"id": shape.new_id(), "type": "message", "role": "assistant", "model": req.model}

            def keep(msg: dict[str, Any]) -> None:
                u = msg["usage"]
                ledger.remember(msg["id"], tenant, req, msg, u["input_tokens"] + u["cache_read_input_tokens"])

            events = live.events(answer.body_iterator, head, keep)
            return StreamingResponse(events, media_type="text/event-stream")
        resp = await chat(creq, request)
        body = json.loads(bytes(resp.body))
        msg = shape.message(shape.new_id(), req.model, body)
        u = msg["usage"]
        prompt = u["input_tokens"] + u["cache_read_input_tokens"]
        if asks_diagnosis:
            msg["diagnostics"] = ledger.diagnose(tenant, req, prompt, u["cache_read_input_tokens"])
        ledger.remember(msg["id"], tenant, req, msg, prompt)
        if req.stream:
            return StreamingResponse(stream.events(msg), media_type="text/event-stream")
        return JSONResponse(msg)

    @r.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest, request: Request) -> dict[str, object]:
        creq = _salted(chat_request(req), request)
        messages = [m.model_dump(exclude_none=True) for m in creq.messages]
        plan = await tools.plan(creq)
        prompt = await reasoning.prompt(messages, plan, {}, creq.cache_salt)
        if prompt.ids is not None:
            return {"input_tokens": len(prompt.ids)}
        ids = await state.bridge.call(state.engine.tokenize, prompt.text)
        return {"input_tokens": len(ids)}

    return r
