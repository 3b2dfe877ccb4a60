"""Runaway work and weights: SGLang's `/abort_request` and `/update_weights_from_disk`, and the
disconnect watch that aborts a non-streaming request whose client left (as SGLang does).

`POST /abort_request {"rid": "...", "abort_all": false}` -> 200 (empty body). A running request stops
at the next step boundary and answers with `meta_info.finish_reason` = SGLang's
`{"type": "abort", "message": "Aborted", "status_code": null, "err_type": null}`; its computed KV
goes into the tree, as in SGLang. `rid` matches as a prefix (SGLang's rule): `"job"` also stops a
batch's `job_0`, `job_1`.

`POST /update_weights_from_disk {"model_path": ..., "load_format"?, "abort_all_requests"?,
"weight_version"?}` -> `{"success", "message", "num_paused_requests"}` (400 with `success: false`
when the weights cannot be used, 409 while another update runs or when running requests outlast
--weights-swap-wait-s). Only headers are read before the load; every unusable path gets one answer.
The whole cache is invalidated; requests running when the swap is due finish under the old weights
first (or stop, with `abort_all_requests`); new requests wait for the swap at most the bound.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from runtime.errors import Busy, InvalidRequest
from runtime.server.auth import ADMIN_SCOPE
from runtime.server.errors import ApiError
from runtime.server.schemas import AbortRequestBody, UpdateWeightsFromDiskBody
from runtime.server.state import ServerState

T = TypeVar("T")


def _failed(status: int, message: str) -> JSONResponse:
    """SGLang's failure body, with an error object as our other errors carry."""
    kind = "conflict_error" if status == 409 else "invalid_request_error"
    body = {
        "success": False,
        "message": message,
        "num_paused_requests": 0,
        "error": {"message": message, "type": kind, "code": status},
    }
    return JSONResponse(body, status_code=status)


log = logging.getLogger("radixagent.server")


def _abort_scope(state: ServerState, req: AbortRequestBody, request: Request) -> str | None:
    """The salt an abort is confined to. The admin (and anyone on a server without keys) may
    abort across tenants, or name a salt; a tenant must name its own `cache_salt` and reaches
    only requests under it (403 without one: SGLang's rid prefix would reach other tenants')."""
    admin = request.scope.get("state", {}).get(ADMIN_SCOPE)
    if admin is False and req.cache_salt is None:
        raise ApiError(
            403,
            "/abort_request needs the admin key, or a cache_salt: a tenant aborts only its own requests",
            "permission_error",
        )
    if state.args.require_cache_salt and not admin and not req.cache_salt:
        raise ApiError(400, "cache_salt is required by this server (--require-cache-salt)")
    return req.cache_salt


def control_router(state: ServerState) -> APIRouter:
    r = APIRouter()

    @r.post("/abort_request")
    async def abort_request(req: AbortRequestBody, request: Request) -> Response:
        salt = _abort_scope(state, req, request)
        await state.bridge.call(state.engine.abort_request, req.rid, req.abort_all, False, salt)
        if state.metrics is not None:
            state.metrics.aborted(1)
        return Response(status_code=200)

    @r.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: UpdateWeightsFromDiskBody) -> Response:
        wait = state.args.weights_swap_wait_s
        try:
            # a thread of its own: it waits for running requests, which must not hold it up
            result = await anyio.to_thread.run_sync(
                lambda: state.engine.update_weights_from_disk(
                    req.model_path,
                    load_format=req.load_format,
                    abort_all_requests=req.abort_all_requests,
                    timeout_s=wait,
                )
            )
        except Busy as exc:
            return _failed(409, f"Failed to update weights: {exc}; retry when it is done")
        except TimeoutError:
            # new requests waited at most `wait` seconds behind the swap, and run again now
            message = (
                f"Failed to update weights: requests still running after {wait:g} s (--weights-swap-wait-s); "
                "weights not changed: retry, or send abort_all_requests"
            )
            return _failed(409, message)
        except (InvalidRequest, RuntimeError) as exc:
            return _failed(400, f"Failed to update weights: {exc}")
        state.model_path = str(req.model_path)
        if req.weight_version is not None:
            state.weight_version = req.weight_version
        return JSONResponse(result)

    return r


def normalize_rid(rid: str | list[str] | None, count: int, is_batch: bool) -> str | list[str]:
    """SGLang's rule: no rid gets fresh ids; a string for a batch becomes `rid_0`, `rid_1`, ..."""
    if not is_batch:
        if isinstance(rid, list):
            raise ApiError(400, "rid: a list of ids needs a batch of prompts")
        return rid or uuid.uuid4().hex
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(count)]
    if len(rid) != count:
        raise ApiError(400, f"rid: {len(rid)} ids for {count} prompts")
    return rid


async def abort_on_disconnect(
    state: ServerState, request: Request, rid: str | list[str], work: Awaitable[T]
) -> T:
    """Await `work` (a non-streaming generation); if the client disconnects first, abort its engine
    requests (exact rid: never a prefix, which would reach other clients) and let `work` return."""

    async def watch() -> None:
        while True:
            message = await request.receive()  # the body is read: the next message is the disconnect
            if message["type"] == "http.disconnect":
                break
        try:
            for one in [rid] if isinstance(rid, str) else rid:
                # exact: rid `job` leaving must not stop another client's `job-1234`
                await state.bridge.call(state.engine.abort_request, one, False, True)
        except Exception:  # the generation still ends (or fails) on its own; never mask it
            log.exception("abort after a client disconnect failed")
            return
        if state.metrics is not None:
            state.metrics.aborted(1)

    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            value = await work
        except Exception as exc:  # re-raised below, outside the task group (which would wrap it)
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return value


def internal_states(state: ServerState, stats: dict[str, Any]) -> list[dict[str, Any]]:
    """SGLang's `/server_info` `internal_states`: one dict per DP rank (one here) with the
    scheduler's live figures; `memory_usage` in GB as SGLang reports it."""
    info = state.engine.info()
    return [
        {
            "world_size": 1,
            "dp_size": 1,
            "effective_max_running_requests_per_dp": info.config.max_running_requests,
            "max_total_num_tokens": stats.get("pool_capacity_tokens"),
            "last_gen_throughput": float(stats.get("gen_throughput", 0.0)),
            "memory_usage": {
                "weight": round(info.weight_bytes / 2**30, 3),
                "kvcache": round(float(stats.get("pool_capacity_bytes", 0)) / 2**30, 3),
                "token_capacity": int(stats.get("pool_capacity_tokens", 0)),
                "token_capacity_swa": None,
                "graph": {},
            },
            "weight_version": state.weight_version,
            "weights_version": int(stats.get("weights_version", 0)),
        }
    ]
