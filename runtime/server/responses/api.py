"""Routes: POST /v1/responses, GET/DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items.

A response is served through the chat path (same templates, tool grammar, reasoning parser and
cache); `previous_response_id` continues from the stored items of the chain (store.py), and the
chain is the trace session (`prompt_cache_key`, unless the client names one).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.errors import PromptTooLong
from runtime.server.errors import ApiError
from runtime.server.responses import live, shape
from runtime.server.responses.models import ResponsesRequest
from runtime.server.responses.store import ResponseStore, StoreConfig, StoredResponse
from runtime.server.responses.translate import input_items, to_chat_body
from runtime.server.schemas import ChatCompletionRequest, StreamOptions
from runtime.server.state import ServerState
from runtime.server.turn_records import CAPTURE, Replay

Chat = Callable[[ChatCompletionRequest, Request], Awaitable[Response]]

#: `include` values this server can honour: none yet (logprobs and encrypted reasoning are not kept)
INCLUDABLE: frozenset[str] = frozenset()
_TEXT_KEYS = {"format"}


def _tenant(request: Request, salt: str | None) -> str:
    """Whose stored responses these are: the caller's key and cache_salt together."""
    key = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    return hashlib.sha256(f"{key}\0{salt or ''}".encode()).hexdigest()


def _check(req: ResponsesRequest) -> None:
    """What the model accepts but this server cannot honour: a 400 naming it."""
    bad = sorted(set(req.include or []) - INCLUDABLE)
    if bad:
        raise ApiError(400, f"include: {bad} cannot be returned by this server (supported: none)")
    extra = sorted(set(req.text or {}) - _TEXT_KEYS)
    if extra:
        raise ApiError(400, f"text: {extra} not supported (only text.format)")


def _prior(store: ResponseStore, tenant: str, req: ResponsesRequest) -> StoredResponse | None:
    if req.previous_response_id is None:
        return None
    prior = store.get(tenant, req.previous_response_id)
    if prior is None:
        raise ApiError(
            404, f"previous_response_id: response {req.previous_response_id!r} not found", "not_found_error"
        )
    return prior


def _chat_request(
    req: ResponsesRequest, context: list[dict[str, object]], session: str
) -> ChatCompletionRequest:
    try:
        body = to_chat_body(req, context)
        body["prompt_cache_key"] = session
        for name in ("cache_salt", "session_id"):
            if getattr(req, name) is not None:
                body[name] = getattr(req, name)
        return ChatCompletionRequest.model_validate(body)
    except KeyError as exc:  # an item without a field its type needs (call_id, name, ...)
        raise ApiError(400, f"input: an item lacks the field {exc.args[0]!r}") from None
    except (ValueError, TypeError) as exc:
        raise ApiError(400, str(exc)) from None


async def _run(
    chat: Chat, req: ResponsesRequest, context: list[dict[str, object]], session: str, request: Request
) -> Response:
    """The chat route's answer for `req` (streamed when `req.stream`, with usage at the end); with
    truncation "auto", the oldest context items are dropped until the prompt fits (OpenAI's rule),
    never the instructions or this request's input."""
    while True:
        creq = _chat_request(req, context, session)
        if req.stream:
            creq.stream = True
            creq.stream_options = StreamOptions(include_usage=True)
        try:
            return await chat(creq, request)
        except PromptTooLong:
            if req.truncation != "auto" or not context:
                raise
            context = context[1:]


def responses_router(state: ServerState, chat: Chat) -> APIRouter:
    r = APIRouter()
    store = ResponseStore(StoreConfig(max_bytes=state.args.responses_store_max_mb * 2**20))
    _create_route(r, state, chat, store)
    _stored_routes(r, store)
    return r


def _create_route(r: APIRouter, state: ServerState, chat: Chat, store: ResponseStore) -> None:
    @r.post("/v1/responses")
    async def create(req: ResponsesRequest, request: Request) -> Response:
        _check(req)
        tenant = _tenant(request, req.cache_salt)
        prior = _prior(store, tenant, req)
        context = prior.context() if prior is not None else []
        rid = shape.new_id("resp")
        # the trace's session: the client's name for it (key, then header), else the chain
        named = req.prompt_cache_key or request.headers.get("x-session-id")
        session = named or (prior.chain if prior is not None else rid)
        items = tuple(input_items(req))
        # the turns this request records (and the chain's, put back first) go with what is stored
        recorded: list[Replay] = []
        CAPTURE.set(recorded)
        if prior is not None:
            prior.restore()

        def keep(response: dict[str, object]) -> None:
            if req.store:
                stored = StoredResponse((*context, *items), response, items, session, tuple(recorded))
                store.put(tenant, rid, stored)

        answer = await _run(chat, req, context, session, request)
        model = req.model or state.model_name
        if isinstance(answer, StreamingResponse):
            stream = live.events(answer.body_iterator, shape.head(rid, req, model), keep)
            return StreamingResponse(stream, media_type="text/event-stream")
        response = shape.response(rid, req, model, json.loads(bytes(answer.body)))
        keep(response)
        return JSONResponse(response)


def _stored_routes(r: APIRouter, store: ResponseStore) -> None:
    """What `store: true` kept, per tenant: another tenant's id answers as an unknown one."""

    def _stored(rid: str, request: Request) -> StoredResponse:
        item = store.get(_tenant(request, request.query_params.get("cache_salt")), rid)
        if item is None:
            raise ApiError(404, f"response {rid!r} not found", "not_found_error")
        return item

    @r.get("/v1/responses/{rid}")
    async def get(rid: str, request: Request) -> dict[str, object]:
        return _stored(rid, request).body

    @r.delete("/v1/responses/{rid}")
    async def delete(rid: str, request: Request) -> dict[str, object]:
        _stored(rid, request)
        store.delete(_tenant(request, request.query_params.get("cache_salt")), rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}

    @r.get("/v1/responses/{rid}/input_items")
    async def items(
        rid: str,
        request: Request,
        order: Literal["asc", "desc"] = "desc",
        limit: int = Query(20, ge=1, le=100),
    ) -> dict[str, object]:
        stored = _stored(rid, request).input_items
        data = [dict(item, id=item.get("id") or f"item_{rid[5:]}_{i}") for i, item in enumerate(stored)]
        data = (data[::-1] if order == "desc" else data)[:limit]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(stored) > limit,
        }
