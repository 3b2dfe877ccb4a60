"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models.

`usage.prompt_tokens_details.cached_tokens` is always present (0 on a miss). Streams are SSE chunks
ending with `data: [DONE]`; with `stream_options.include_usage` a last chunk with empty `choices`
carries the usage, as OpenAI sends it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.server.bridge import SSE_DONE, close_stream, sse, sse_error
from runtime.server.errors import ApiError
from runtime.server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, _OpenAIBase
from runtime.server.state import ServerState


def openai_router(state: ServerState) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        if req.suffix:
            raise ApiError(400, "suffix: not supported")
        prompt, input_ids = _split_prompt(req.prompt)
        kwargs = _kwargs(state, req, req.max_tokens, prompt=prompt, input_ids=input_ids)
        call = _Call(state, req, "text_completion", "cmpl")
        if req.stream:
            _check_single(req, prompt if prompt is not None else input_ids)
            chunks = await state.bridge.open_stream(**kwargs)
            return StreamingResponse(call.stream(chunks, chat=False), media_type="text/event-stream")
        outs = await _generate_n(state, kwargs, req.n)
        echo = (
            [_echo_text(state, prompt, input_ids, i // req.n) for i in range(len(outs))] if req.echo else None
        )
        return JSONResponse(call.completion_body(outs, echo))

    @r.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest) -> Response:
        messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
        text = await state.bridge.call(state.engine.apply_chat_template, messages, add_generation_prompt=True)
        kwargs = _kwargs(state, req, req.max_new_tokens, prompt=text)
        call = _Call(state, req, "chat.completion", "chatcmpl")
        if req.stream:
            _check_single(req, text)
            chunks = await state.bridge.open_stream(**kwargs)
            return StreamingResponse(call.stream(chunks, chat=True), media_type="text/event-stream")
        outs = await _generate_n(state, kwargs, req.n)
        return JSONResponse(call.chat_body(outs))

    @r.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @r.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model not in (state.model_name, state.model_path):
            raise ApiError(404, f"model {model!r} not found", "not_found_error")
        return _model_card(state)

    return r


def _model_card(state: ServerState) -> dict[str, Any]:
    info = dict(getattr(state.engine, "model_info", None) or {})
    return {
        "id": state.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "radixagent",
        "root": state.model_path,
        "max_model_len": info.get("context_length"),
    }


def _split_prompt(prompt: Any) -> tuple[str | list[str] | None, list[int] | list[list[int]] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if not prompt:
        raise ApiError(400, "prompt: must not be empty")
    if isinstance(prompt[0], str):
        return prompt, None
    return None, prompt


def _check_single(req: _OpenAIBase, prompt: Any) -> None:
    is_batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    if req.n != 1 or is_batch:
        raise ApiError(400, "stream: streaming supports one prompt with n=1")


def _kwargs(
    state: ServerState, req: _OpenAIBase, max_new_tokens: int | None, **inputs: Any
) -> dict[str, Any]:
    if req.logprobs:
        raise ApiError(400, "logprobs: not supported by this server")
    return state.engine_kwargs(
        **inputs,
        sampling=req.sampling_dict(max_new_tokens),
        cache_salt=req.cache_salt,
        session_id=req.session_id or state.check_session_params(req.session_params, req.cache_salt),
        priority=req.priority,
        prefix_cache=req.prefix_cache,
        rid=req.rid,
    )


async def _generate_n(state: ServerState, kwargs: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """One engine call for the whole batch: each prompt repeated `n` times, in prompt order."""
    key = "prompt" if "prompt" in kwargs else "input_ids"
    value = kwargs[key]
    prompts = value if isinstance(value, list) and value and isinstance(value[0], (str, list)) else [value]
    if n > 1 or len(prompts) > 1:
        kwargs = {**kwargs, key: [p for p in prompts for _ in range(n)]}
        kwargs.pop("rid", None)
    out = await state.bridge.generate(**kwargs)
    outs = out if isinstance(out, list) else [out]
    state.observe("openai", outs)
    return outs


def _echo_text(state: ServerState, prompt: Any, input_ids: Any, index: int) -> str:
    if prompt is not None:
        return prompt if isinstance(prompt, str) else prompt[index]
    ids = input_ids if isinstance(input_ids[0], int) else input_ids[index]
    return state.engine.decode(ids)


def _message_dict(index: int, message: ChatMessage) -> dict[str, Any]:
    """A template-ready message; content parts must be text."""
    data = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        texts = []
        for part in message.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"messages.{index}.content: only text parts are supported")
            texts.append(part["text"])
        data["content"] = "".join(texts)
    elif message.content is None:
        data["content"] = ""
    return data


def _finish(meta: dict[str, Any]) -> tuple[str, Any]:
    reason = meta.get("finish_reason") or {}
    if isinstance(reason, dict):
        return str(reason.get("type", "stop")), reason.get("matched")
    return str(reason), None


def usage(metas: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(int(m.get("prompt_tokens", 0)) for m in metas)
    completion = sum(int(m.get("completion_tokens", 0)) for m in metas)
    cached = sum(int(m.get("cached_tokens", 0) or 0) for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class _Call:
    """Response shaping for one OpenAI request (ids, timestamps, chunk format)."""

    def __init__(self, state: ServerState, req: _OpenAIBase, object_: str, prefix: str) -> None:
        self.state = state
        self.req = req
        self.object = object_
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = req.model or state.model_name

    def _envelope(self, object_: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def completion_body(self, outs: list[dict[str, Any]], echo: list[str] | None) -> dict[str, Any]:
        choices = []
        for i, out in enumerate(outs):
            reason, matched = _finish(out["meta_info"])
            text = (echo[i] if echo else "") + out["text"]
            choices.append(
                {"index": i, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
            )
        body = self._envelope("text_completion", choices)
        body["usage"] = usage([o["meta_info"] for o in outs])
        return body

    def chat_body(self, outs: list[dict[str, Any]]) -> dict[str, Any]:
        choices = []
        for i, out in enumerate(outs):
            reason, matched = _finish(out["meta_info"])
            message = {"role": "assistant", "content": out["text"], "tool_calls": None}
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        body = self._envelope("chat.completion", choices)
        body["usage"] = usage([o["meta_info"] for o in outs])
        return body

    def _chunk(self, chat: bool, delta: str, reason: str | None, role: bool = False) -> dict[str, Any]:
        if chat:
            payload: dict[str, Any] = {"role": "assistant", "content": delta} if role else {"content": delta}
            choice = {"index": 0, "delta": payload, "logprobs": None, "finish_reason": reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
        return self._envelope("text_completion", [choice])

    async def stream(self, chunks: AsyncIterator[dict[str, Any]], chat: bool) -> AsyncIterator[bytes]:
        """Engine chunks carry cumulative text; OpenAI chunks carry deltas."""
        sent, last = "", None
        try:
            if chat:
                yield sse(self._chunk(chat, "", None, role=True))
            async for chunk in chunks:
                last = chunk
                text = chunk.get("text", "")
                delta, sent = text[len(sent) :], text
                if delta:
                    yield sse(self._chunk(chat, delta, None))
        except Exception as exc:  # headers already sent: report in-band
            last = None
            yield sse_error(exc)
        finally:
            await close_stream(chunks)
        if last is not None:
            for event in self._tail(last, chat):
                yield event
        yield SSE_DONE

    def _tail(self, last: dict[str, Any], chat: bool) -> list[bytes]:
        """The finish_reason chunk and, when asked, the usage chunk."""
        meta = last.get("meta_info", {})
        self.state.observe("openai", last)
        events = [sse(self._chunk(chat, "", _finish(meta)[0]))]
        if self.req.include_usage:
            body = self._envelope("chat.completion.chunk" if chat else "text_completion", [])
            body["usage"] = usage([meta])
            events.append(sse(body))
        return events
