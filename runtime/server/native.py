"""SGLang-native endpoints: /generate, health, info, load (/get_load, /v1/loads), cache, sessions,
tokenizer.

Session events (the session-aware eviction policy's input; see DESIGN.md):
`POST /open_session {session_id?}` -> the id (JSON string), `POST /close_session {session_id}`,
`POST /session_event {session_id, event: open|tool_wait|resume|abandon|close, ...info}`
(e.g. `{"event": "tool_wait", "expected_s": 3.0}`) -> `{"success": true}`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from runtime.engine.generation import GenerationRequest
from runtime.errors import UnknownSession
from runtime.server import loads as loads_api
from runtime.server.bridge import SSE_DONE, close_stream, sse, sse_error
from runtime.server.control import abort_on_disconnect, internal_states, normalize_rid
from runtime.server.errors import ApiError
from runtime.server.redact import redact
from runtime.server.schemas import (
    CloseSessionRequest,
    DetokenizeRequest,
    GenerateRequest,
    OpenSessionRequest,
    SessionEventRequest,
    TokenizeRequest,
)
from runtime.server.state import ServerState, join_salt

if TYPE_CHECKING:
    pass

log = logging.getLogger("radixagent.server")

VERSION = "0.1.0"


def native_router(state: ServerState) -> APIRouter:
    r = APIRouter()
    _generate_routes(r, state)
    _info_routes(r, state)
    _load_routes(r, state)
    _cache_and_session_routes(r, state)
    _tokenizer_routes(r, state)
    return r


def _generate_routes(r: APIRouter, state: ServerState) -> None:
    """/generate and the health probes that generate."""

    @r.post("/generate")
    @r.put("/generate")
    async def generate(req: GenerateRequest, request: Request) -> Response:
        if req.stream and req.is_batch:  # before building: the batch's own fields are moot
            raise ApiError(400, "stream: streaming a batch is not supported; send one request per prompt")
        requests = _generate_requests(state, req)
        if req.stream:
            chunks = await state.bridge.open_stream(requests[0])
            return StreamingResponse(_native_events(state, chunks), media_type="text/event-stream")
        rids = [r.rid for r in requests if r.rid is not None]
        outs = await abort_on_disconnect(state, request, rids, state.bridge.generate(requests))
        out = outs if req.is_batch else outs[0]
        state.observe("generate", out)
        return JSONResponse(out)

    @r.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @r.get("/health_generate")
    async def health_generate() -> Response:
        probe = GenerationRequest(
            input_ids=(0,), sampling_params={"max_new_tokens": 1, "temperature": 0.0}, prefix_cache=False
        )
        await state.bridge.generate([probe])
        return Response(status_code=200)


def _info_routes(r: APIRouter, state: ServerState) -> None:
    """What the server is: model and server info (credentials redacted)."""

    @r.get("/get_model_info")
    @r.get("/model_info")
    async def model_info() -> dict[str, object]:
        return _model_info(state)

    @r.get("/get_server_info")
    @r.get("/server_info")
    async def server_info() -> dict[str, object]:
        stats = await state.bridge.call(state.engine.get_cache_stats)
        info = state.engine.info()
        # credentials never leave (a tier URL's Redis password read another tenant's KV)
        return redact(
            {
                "version": VERSION,
                **state.args.public_dict(),
                **_router_fields(state, stats),
                "kv_cache_dtype": stats.get("kv_cache_dtype"),
                "attention_backend": stats.get("attention_backend"),
                "enable_deterministic_inference": info.config.enable_deterministic_inference,
                "engine_config": info.config_dict(),
                "model_info": _model_info(state),
                "cache_stats": stats,
                "internal_states": internal_states(state, stats),
                "kv_events": info.kv_events,
                "trace_dir": _trace_stats(state),
            }
        )


def _load_routes(r: APIRouter, state: ServerState) -> None:
    """How loaded the worker is: what sglang-router and smg poll."""

    @r.get("/get_load")
    async def get_load() -> list[dict[str, object]]:
        """SGLang's per-DP-rank load (one rank here); sglang-router reads `num_tokens`."""
        stats = await state.bridge.call(state.engine.get_cache_stats)
        return [_load(stats)]

    @r.get("/v1/loads")
    async def v1_loads(
        dp_rank: int | None = None, include: str | None = None, format: str | None = None
    ) -> Response:
        """SGLang's /v1/loads (what smg's load monitor polls): `include` = comma-separated sections
        (core, memory, spec, lora, disagg, queues, all; default all), `format` = json | prometheus."""
        sections = loads_api.parse_sections(include)
        if format not in (None, "json", "prometheus"):
            raise ApiError(400, f"format: {format!r} is not one of 'json', 'prometheus'")
        loads = (
            [] if dp_rank not in (None, 0) else [await state.bridge.call(loads_api.snapshot, state.engine)]
        )
        loads = [loads_api.select_sections(load, sections) for load in loads]
        if format == "prometheus":
            return Response(
                loads_api.prometheus(loads), media_type="text/plain; version=0.0.4; charset=utf-8"
            )
        accelerator, count = loads_api.accelerator(state.engine)
        return JSONResponse(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": VERSION,
                "accelerator": accelerator,
                "num_accelerators": count,
                "loads": loads,
            }
        )


def _cache_and_session_routes(r: APIRouter, state: ServerState) -> None:
    """The cache's flush and the session events the session-aware eviction policy reads."""

    @r.post("/flush_cache")
    @r.get("/flush_cache")
    async def flush_cache() -> Response:
        if await state.bridge.call(state.engine.flush_cache):
            return PlainTextResponse("Cache flushed.\n")
        raise ApiError(400, "Cache not flushed: requests are running or waiting.")

    @r.post("/open_session")
    async def open_session(req: OpenSessionRequest) -> str:
        session_id = req.session_id or uuid.uuid4().hex
        await state.bridge.call(state.engine.session_event, session_id, "open", cache_salt=req.cache_salt)
        return session_id

    @r.post("/close_session")
    async def close_session(req: CloseSessionRequest) -> Response:
        """SGLang's contract: closing is idempotent. A session that is not open under this salt
        (never used, already closed, or another tenant's) is left alone and the answer is the
        same 200, as SGLang answers (its session radix cache releases nothing, its controller logs
        a warning). `/session_event` `close` still refuses an unknown session with a 400."""
        try:
            await state.bridge.call(
                state.engine.session_event, req.session_id, "close", cache_salt=req.cache_salt
            )
        except UnknownSession:
            log.info("close_session: %r is not open; nothing to close", req.session_id)
        return Response(status_code=200)

    @r.post("/session_event")
    async def session_event(req: SessionEventRequest) -> dict[str, object]:
        await state.bridge.call(state.engine.session_event, req.session_id, req.event, **req.info)
        return {"success": True}


def _tokenizer_routes(r: APIRouter, state: ServerState) -> None:
    """Tokenize/detokenize, and /metrics where enabled."""

    @r.post("/tokenize")
    @r.post("/v1/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, object]:
        return await state.bridge.call(_tokenize, state, req)

    @r.post("/detokenize")
    @r.post("/v1/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, object]:
        return await state.bridge.call(_detokenize, state, req)

    if state.metrics is not None:
        metrics = state.metrics

        @r.get("/metrics")
        async def prometheus() -> Response:
            body = await state.bridge.call(metrics.render)
            return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def _generate_requests(state: ServerState, req: GenerateRequest) -> list[GenerationRequest]:
    """One engine request per prompt of the body, named by SGLang's rid rule."""
    try:
        sampling = req.sampling_dicts()
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc
    salt = join_salt(req.cache_salt, req.extra_key)
    session_id = req.session_id or state.check_session_params(req.session_params, salt)
    return state.requests(
        prompt=req.text,
        input_ids=req.input_ids if req.text is None else None,
        sampling=sampling,
        cache_salt=salt,
        session_id=session_id,
        priority=req.priority,
        prefix_cache=req.prefix_cache,
        rid=normalize_rid(req.rid, _batch_size(req), req.is_batch),
        logprobs=req.logprob_kwargs(),
    )


def _batch_size(req: GenerateRequest) -> int:
    prompts = req.text if req.text is not None else req.input_ids
    return len(prompts) if req.is_batch else 1  # type: ignore[arg-type]


async def _native_events(
    state: ServerState, chunks: AsyncIterator[dict[str, object]]
) -> AsyncIterator[bytes]:
    """SGLang's stream: `data: {cumulative text, output_ids, meta_info}` per chunk, then `data: [DONE]`."""
    last: dict[str, object] | None = None
    try:
        async for chunk in chunks:
            last = chunk
            yield sse(chunk)
    except Exception as exc:  # headers are sent: report in-band like SGLang
        yield sse_error(exc)
    finally:
        await close_stream(chunks)
    if last is not None:
        state.observe("generate", last, stream=True)
    yield SSE_DONE


def _model_info(state: ServerState) -> dict[str, Any]:
    info = state.engine.info().model_info()
    return {
        **info,
        "model_path": state.model_path,
        "tokenizer_path": info.get("tokenizer_path", state.model_path),
        "served_model_name": state.model_name,
        "model_type": info.get("model_type", info.get("architecture")),
        "architectures": info.get("architectures") or _architectures(info.get("architecture")),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": state.weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


def _architectures(arch: object) -> list[str] | None:
    """HF-style class names (SGLang's /model_info field) from a GGUF architecture name like "llama"."""
    return [f"{str(arch).capitalize()}ForCausalLM"] if arch else None


def _trace_stats(state: ServerState) -> dict[str, int] | None:
    """`--trace-dir`'s bounds in use and the lines it dropped (None: tracing is off)."""
    trace = getattr(state.bridge, "trace", None)
    return None if trace is None else trace.stats()


def _router_fields(state: ServerState, stats: dict[str, object]) -> dict[str, object]:
    """Top-level keys of SGLang's /server_info that sglang-router reads to label a worker."""
    return {
        "model_path": state.model_path,
        "served_model_name": state.model_name,
        "dp_size": 1,
        "max_total_tokens": stats.get("pool_capacity_tokens"),
        "max_running_requests": state.engine.info().config.max_running_requests,
        "load": _load(stats),
    }


def _load(stats: dict[str, Any]) -> dict[str, object]:
    """SGLang's /get_load entry: requests running + queued, queued, KV tokens in use."""
    waiting = int(stats.get("queue_depth", 0))
    return {
        "dp_rank": 0,
        "num_reqs": int(stats.get("running", 0)) + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": int(stats.get("tokens_in_use", 0)),
    }


def _tokenize(state: ServerState, req: TokenizeRequest) -> dict[str, object]:
    tokenizer = state.engine.tokenizer

    def encode(text: str) -> list[int]:
        if req.add_special_tokens:
            return list(tokenizer(text, add_special_tokens=True)["input_ids"])
        return list(state.engine.tokenize(text))

    context = int(_model_info(state).get("context_length") or 0)
    if isinstance(req.prompt, str):
        tokens = encode(req.prompt)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": context}
    batch = [encode(p) for p in req.prompt]
    return {"tokens": batch, "count": [len(t) for t in batch], "max_model_len": context}


def _detokenize(state: ServerState, req: DetokenizeRequest) -> dict[str, object]:
    tokenizer = state.engine.tokenizer
    vocab = int(_model_info(state).get("vocab_size") or 0)
    is_batch = bool(req.tokens) and isinstance(req.tokens[0], list)
    batch = cast(list[list[int]], req.tokens if is_batch else [req.tokens])  # the schema's two shapes
    for ids in batch:
        bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise ApiError(400, f"tokens: ids out of range: {bad[:5]}")
    texts = [tokenizer.decode(ids, skip_special_tokens=req.skip_special_tokens) for ids in batch]
    return {"text": texts if is_batch else texts[0]}
