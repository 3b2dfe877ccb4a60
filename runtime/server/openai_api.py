"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models.

`usage.prompt_tokens_details.cached_tokens` is always present (0 on a miss). Streams are SSE chunks
ending with `data: [DONE]`; with `stream_options.include_usage` a last chunk with empty `choices`
carries the usage, as OpenAI sends it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.engine.generation import GenerationRequest, LogprobArgs
from runtime.server import openai_logprobs as lp
from runtime.server.bridge import SSE_DONE, close_stream, sse, sse_error
from runtime.server.control import abort_on_disconnect, normalize_rid
from runtime.server.errors import ApiError
from runtime.server.messages.api import messages_router
from runtime.server.openai_stream import close_merged, merge_streams
from runtime.server.openai_usage import finish_of as _finish
from runtime.server.openai_usage import usage
from runtime.server.reasoning import REASONING, ReasoningStream
from runtime.server.reasoning_chat import ReasoningChat
from runtime.server.responses.api import Chat, responses_router
from runtime.server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, _OpenAIBase
from runtime.server.state import ServerState
from runtime.server.tools.chat import ToolCalling
from runtime.server.trace_dir import TRACE_SESSION


def openai_router(state: ServerState) -> APIRouter:
    r = APIRouter()
    _completions_route(r, state)
    tools = ToolCalling(state)
    reasoning = ReasoningChat(state, tools)
    chat = _chat_route(r, state, tools, reasoning)
    _model_routes(r, state)
    # the other doors translate to chat and back: one path to the engine, one tool/reasoning plan
    r.include_router(messages_router(state, chat, tools, reasoning))
    r.include_router(responses_router(state, chat))
    return r


def _completions_route(r: APIRouter, state: ServerState) -> None:
    @r.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        if req.suffix:
            raise ApiError(400, "suffix: not supported")
        prompt, input_ids = _split_prompt(req.prompt)
        requests = _requests(state, req, req.max_tokens, prompt=prompt, input_ids=input_ids)
        call = _Call(state, req, "text_completion", "cmpl")
        if req.stream:
            _check_single(req, prompt if prompt is not None else input_ids)
            streams = await _open_streams(state, requests, req.n)
            first = _echo_text(state, prompt, input_ids, 0) if req.echo else ""
            return StreamingResponse(
                call.stream(streams, chat=False, echo=first), media_type="text/event-stream"
            )
        outs = await abort_on_disconnect(state, request, _rid(requests), _generate_n(state, requests, req))
        echo = (
            [_echo_text(state, prompt, input_ids, i // req.n) for i in range(len(outs))] if req.echo else None
        )
        return JSONResponse(call.completion_body(outs, echo))


def _chat_route(r: APIRouter, state: ServerState, tools: ToolCalling, reasoning: ReasoningChat) -> Chat:
    """/v1/chat/completions; the handler is returned for the doors that translate to it."""

    @r.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
        template_kwargs = reasoning.effort(req.reasoning_effort, _template_kwargs(req.chat_template_kwargs))
        reasoning.check(req, template_kwargs)
        plan = await tools.plan(req)
        # earlier turns as generated (runtime/server/reasoning_history.py): ids where they fix tokens
        prompt = await reasoning.prompt(messages, plan, template_kwargs, req.cache_salt)
        text = prompt.text
        if prompt.ids is None:
            requests = _requests(state, req, req.max_new_tokens, prompt=text)
        else:
            requests = _requests(state, req, req.max_new_tokens, input_ids=prompt.ids)
        if plan is not None:
            requests = [
                replace(r, sampling_params=tools.constrain(r.sampling_params, req, plan)) for r in requests
            ]
        requests = [
            replace(r, sampling_params=reasoning.constrain(dict(r.sampling_params), prompt, template_kwargs))
            for r in requests
        ]
        call = _Call(state, req, "chat.completion", "chatcmpl")
        call.on_done = lambda lasts: reasoning.record(lasts, prompt)
        if req.stream:
            _check_single(req, text)
            if plan is not None and plan.may_call:
                tools.check_streamable(req)
                chunks = await state.bridge.open_stream(requests[0])
                thinking = reasoning.streamer(prompt, req.separate_reasoning)
                events = tools.stream(call, chunks, plan, thinking)
                return StreamingResponse(events, media_type="text/event-stream")
            streams = await _open_streams(state, requests, req.n)
            call.splitters = [reasoning.streamer(prompt, req.separate_reasoning) for _ in streams]
            return StreamingResponse(call.stream(streams, chat=True), media_type="text/event-stream")
        outs = await abort_on_disconnect(state, request, _rid(requests), _generate_n(state, requests, req))
        body = call.chat_body(outs)
        reasoning.shape(body, prompt, req.separate_reasoning)
        if plan is not None:
            tools.shape(body, outs, plan)
        reasoning.record(outs, prompt)
        return JSONResponse(body)

    return chat_completions


def _model_routes(r: APIRouter, state: ServerState) -> None:
    @r.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [_model_card(state)]}

    @r.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, object]:
        if model not in (state.model_name, state.model_path, "default"):  # chat takes "default" too
            raise ApiError(404, f"model {model!r} not found", "not_found_error")
        return _model_card(state)


def _model_card(state: ServerState) -> dict[str, object]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "radixagent",
        "root": state.model_path,
        "max_model_len": state.engine.info().context_length,
    }


CompletionPrompt = str | list[str] | list[int] | list[list[int]]


def _split_prompt(
    prompt: CompletionPrompt,
) -> tuple[str | list[str] | None, list[int] | list[list[int]] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if not prompt:
        raise ApiError(400, "prompt: must not be empty")
    if isinstance(prompt[0], str):
        return prompt, None
    return None, prompt


def _check_single(req: _OpenAIBase, prompt: object) -> None:
    is_batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    if is_batch:
        raise ApiError(400, "stream: streaming supports one prompt (n choices of it)")


#: arguments of transformers' apply_chat_template (messages and tools have their own request fields)
TEMPLATE_CALL_ARGS = frozenset(
    {
        "conversation",
        # variables the render itself sets (a 500 before: {"messages": []} replaced the conversation)
        "messages",
        "raise_exception",
        "strftime_now",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def _template_kwargs(extra: dict[str, object] | None) -> dict[str, object]:
    """`chat_template_kwargs` go to the template as variables (e.g. `enable_thinking`); names of
    apply_chat_template's own arguments would change what it returns, so they are refused."""
    clash = sorted(set(extra or {}) & TEMPLATE_CALL_ARGS)
    if clash:
        raise ApiError(400, f"chat_template_kwargs: {clash} cannot be set (arguments of the template call)")
    return dict(extra or {})


def _requests(
    state: ServerState,
    req: _OpenAIBase,
    max_new_tokens: int | None,
    *,
    prompt: str | list[str] | None = None,
    input_ids: list[int] | list[list[int]] | None = None,
) -> list[GenerationRequest]:
    """One engine request per prompt, each named by the call's one rid; `_choices` turns them into
    the choices that run."""
    lp.candidates(req)  # best_of is checked before anything runs
    if req.prompt_cache_key:  # issue 19: names the trace session (runtime/server/trace_dir.py)
        TRACE_SESSION.set(req.prompt_cache_key)
    logprobs = lp.engine_logprob_kwargs(req)
    return state.requests(
        prompt=prompt,
        input_ids=input_ids,
        sampling=req.sampling_dict(max_new_tokens),
        cache_salt=req.cache_salt,
        session_id=req.session_id or state.check_session_params(req.session_params, req.cache_salt),
        priority=req.priority,
        prefix_cache=req.prefix_cache,
        rid=normalize_rid(req.rid, 1, False),
        logprobs=logprobs,
    )


def _rid(requests: list[GenerationRequest]) -> str:
    """The call's rid (an abort of it stops every choice: SGLang matches rids as prefixes)."""
    rid = requests[0].rid
    assert rid is not None  # `_requests` names every request
    return rid


def _choices(requests: list[GenerationRequest], count: int) -> list[GenerationRequest]:
    """`count` engine requests per prompt, in prompt order: choice i samples with `seed + i`. More
    than one in all are named rid_0, rid_1, ... as SGLang names a batch (an abort of `rid` stops
    them all)."""
    if len(requests) * count == 1:
        return requests
    return [
        replace(r, sampling_params=lp.choice_sampling(r.sampling_params, i), rid=f"{r.rid}_{p * count + i}")
        for p, r in enumerate(requests)
        for i in range(count)
    ]


async def _open_streams(
    state: ServerState, requests: list[GenerationRequest], n: int
) -> list[AsyncIterator[dict[str, object]]]:
    """One engine stream per choice; the first is opened (and its prompt queued) before the others,
    so they find its prefix in the tree instead of computing it again."""
    streams: list[AsyncIterator[dict[str, object]]] = []
    try:
        for choice in _choices(requests, n):
            streams.append(await state.bridge.open_stream(choice))
    except BaseException:
        for stream in streams:
            await close_stream(stream)
        raise
    return streams


#: the logprobs best_of ranks candidates by (SGLang's output logprobs, nothing else)
RANKING = LogprobArgs(return_logprob=True)


async def _generate_n(
    state: ServerState, requests: list[GenerationRequest], req: _OpenAIBase
) -> list[dict[str, object]]:
    """One engine call for the whole batch: each prompt repeated once per candidate (each with its
    own seed), in prompt order; with best_of, the best `n` of each prompt's candidates."""
    count, n = lp.candidates(req), req.n
    choices = _choices(requests, count)
    if count > n:  # ranking needs logprobs; the response shows them only if asked
        choices = [c if c.logprobs.return_logprob else replace(c, logprobs=RANKING) for c in choices]
    outs = await state.bridge.generate(choices)
    state.observe("openai", outs)
    return [o for i in range(len(requests)) for o in lp.best(outs[i * count : (i + 1) * count], n)]


def _echo_text(
    state: ServerState,
    prompt: str | list[str] | None,
    input_ids: list[int] | list[list[int]] | None,
    index: int,
) -> str:
    if prompt is not None:
        return prompt if isinstance(prompt, str) else prompt[index]
    assert input_ids is not None  # _split_prompt gives one of the two
    ids = input_ids if isinstance(input_ids[0], int) else input_ids[index]
    return state.engine.decode(ids)


def _message_dict(index: int, message: ChatMessage) -> dict[str, object]:
    """A template-ready message; content parts must be text."""
    data = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        texts: list[str] = []
        for part in message.content:
            text = part.get("text")
            if part.get("type") != "text" or not isinstance(text, str):
                raise ApiError(400, f"messages.{index}.content: only text parts are supported")
            texts.append(text)
        data["content"] = "".join(texts)
    elif message.content is None:
        data["content"] = ""
    return data


class _Call:
    """Response shaping for one OpenAI request (ids, timestamps, chunk format)."""

    def __init__(self, state: ServerState, req: _OpenAIBase, object_: str, prefix: str) -> None:
        self.state = state
        self.req = req
        self.object = object_
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = req.model or state.model_name
        self.logprobs = bool(req.logprobs is not None and req.logprobs is not False)
        #: per choice, the reasoning parser's splitter (chat streams with --reasoning-parser)
        self.splitters: list[ReasoningStream | None] = []
        #: called with each choice's last chunk once a stream has ended whole
        self.on_done: Callable[[list[dict[str, object]]], None] | None = None

    def _envelope(self, object_: str, choices: list[dict[str, object]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def completion_body(self, outs: list[dict[str, Any]], echo: list[str] | None) -> dict[str, object]:
        choices = []
        for i, out in enumerate(outs):
            meta = out["meta_info"]
            reason, matched = _finish(meta)
            text = (echo[i] if echo else "") + out["text"]
            logprobs = lp.completion_logprobs(meta, bool(echo)) if self.logprobs else None
            choices.append(
                {
                    "index": i,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        body = self._envelope("text_completion", choices)
        body["usage"] = usage([o["meta_info"] for o in outs], self.req.n)
        return body

    def chat_body(self, outs: list[dict[str, Any]]) -> dict[str, object]:
        choices = []
        for i, out in enumerate(outs):
            reason, matched = _finish(out["meta_info"])
            message = {"role": "assistant", "content": out["text"], "tool_calls": None}
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": lp.chat_logprobs(out["meta_info"]) if self.logprobs else None,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        body = self._envelope("chat.completion", choices)
        body["usage"] = usage([o["meta_info"] for o in outs], self.req.n)
        return body

    def _chunk(
        self,
        chat: bool,
        index: int,
        delta: str,
        reason: str | None,
        role: bool = False,
        logprobs: object = None,
        key: str = "content",
    ) -> dict[str, Any]:
        if chat:
            payload: dict[str, object] = {"role": "assistant", key: delta} if role else {key: delta}
            choice = {"index": index, "delta": payload, "logprobs": logprobs, "finish_reason": reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": reason}
        return self._envelope("text_completion", [choice])

    async def stream(
        self, streams: list[AsyncIterator[dict[str, Any]]], chat: bool, echo: str = ""
    ) -> AsyncIterator[bytes]:
        """Engine chunks carry cumulative text (and logprobs); OpenAI chunks carry deltas, one
        choice per chunk, tagged with its index. Under `echo` each choice starts with the prompt."""
        n = len(streams)
        sent, lp_sent = [""] * n, [0] * n
        last: list[dict[str, Any] | None] = [None] * n
        merged = merge_streams(streams)
        try:
            for i in range(n):
                if chat:
                    yield sse(self._chunk(chat, i, "", None, role=True))
            async for i, chunk in merged:
                if last[i] is None and echo:
                    yield sse(self._echo_chunk(i, echo, chunk.get("meta_info", {})))
                last[i] = chunk
                for event in self._deltas(i, chunk, chat, len(echo), sent, lp_sent):
                    yield event
        except Exception as exc:  # headers already sent: report in-band
            last = [None] * n
            yield sse_error(exc)
        finally:  # client gone or done: every engine stream is closed (aborting what still runs)
            await close_merged(merged, streams)
        if all(m is not None for m in last):
            for event in self._tail(last, chat):  # type: ignore[arg-type]
                yield event
        yield SSE_DONE

    def _echo_chunk(self, i: int, echo: str, meta: dict[str, Any]) -> dict[str, object]:
        logprobs = lp.prompt_logprobs(meta) if self.logprobs else None
        return self._with_usage(self._chunk(False, i, echo, None, logprobs=logprobs), meta)

    def _deltas(
        self, i: int, chunk: dict[str, Any], chat: bool, echo_len: int, sent: list[str], lp_sent: list[int]
    ) -> list[bytes]:
        """The chunks one engine chunk of choice `i` turns into: its new text (with the logprobs of
        its new tokens), then its finish_reason once it is done."""
        meta = chunk.get("meta_info", {})
        text = chunk.get("text", "")
        delta = text[len(sent[i]) :]
        entries = self._new_logprobs(meta, chat, lp_sent[i], echo_len + len(sent[i]))
        sent[i] = text
        count = len(entries["content"] if chat else entries["tokens"]) if entries else 0
        lp_sent[i] += count
        splitter = self.splitters[i] if i < len(self.splitters) else None
        pieces = [("content", delta)] if splitter is None else self._split(splitter, text, meta)
        events = []
        for n, (kind, piece) in enumerate(pieces):
            if piece or (count and n == 0):
                key = "reasoning_content" if kind == REASONING else "content"
                body = self._chunk(chat, i, piece, None, logprobs=entries if n == 0 else None, key=key)
                events.append(sse(self._with_usage(body, meta)))
        if not pieces and count:
            events.append(sse(self._with_usage(self._chunk(chat, i, "", None, logprobs=entries), meta)))
        if meta.get("finish_reason") is not None:
            reason, matched = _finish(meta)
            last = self._chunk(chat, i, "", reason)
            last["choices"][0]["matched_stop"] = matched  # SGLang's stream choice field
            events.append(sse(self._with_usage(last, meta)))
        return events

    @staticmethod
    def _split(splitter: ReasoningStream, text: str, meta: dict[str, object]) -> list[tuple[str, str]]:
        """A chat choice's new reasoning / content pieces (flushed on its last chunk)."""
        return splitter.finish(text) if meta.get("finish_reason") is not None else splitter.feed(text)

    def _new_logprobs(
        self, meta: dict[str, object], chat: bool, start: int, offset: int
    ) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if chat:
            return lp.chat_logprobs(meta, start)
        return lp.completion_logprobs(meta, False, start, offset)

    def _with_usage(self, body: dict[str, object], meta: dict[str, object]) -> dict[str, object]:
        """`stream_options.continuous_usage_stats`: this choice's usage so far in every chunk."""
        if self.req.continuous_usage:
            body["usage"] = usage([meta])
        return body

    def _tail(self, last: list[dict[str, Any]], chat: bool) -> list[bytes]:
        """When asked, the usage chunk (empty `choices`) over every choice."""
        metas = [chunk.get("meta_info", {}) for chunk in last]
        self.state.observe("openai", last, stream=True)
        if self.on_done is not None and chat:
            self.on_done(last)
        if not self.req.include_usage:
            return []
        body = self._envelope("chat.completion.chunk" if chat else "text_completion", [])
        body["usage"] = usage(metas, len(metas))
        return [sse(body)]
