"""Error responses: every failure is `{"error": {"message", "type"}}` with the right status.

Client mistakes (validation, malformed JSON, engine `InvalidRequest` and its subclasses) are 400,
a full queue is 503, a wrong key 401. Only a bug in the server itself is a 500.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from runtime.errors import EngineClosed, InvalidRequest, Overloaded, PoolExhausted, RadixAgentError

log = logging.getLogger("radixagent.server")


class ApiError(Exception):
    """Raised by route code to answer with `status` and a message."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_


def error_body(message: str, type_: str, status: int) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "code": status}}


def error_response(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse(error_body(message, type_, status), status_code=status)


def classify(exc: BaseException) -> tuple[int, str, str]:
    """(status, type, message) for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc.status, exc.type, exc.message
    if isinstance(exc, InvalidRequest):
        return 400, "invalid_request_error", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (Overloaded, PoolExhausted)):
        return 503, "overloaded", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, EngineClosed):
        return 503, "unavailable", "the engine is shut down"
    return 500, "internal_error", f"internal error: {type(exc).__name__}"


def format_validation_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """One line per error, naming the field: `body.sampling_params.max_new_tokens: Input should be ...`."""
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx", {}).get("error", "")
            parts.append(f"malformed JSON body: {ctx}".rstrip(": "))
            continue
        if tuple(err.get("loc", ())) == ("body",) and err.get("type") in (
            "model_attributes_type",
            "dict_type",
        ):
            parts.append("the body must be a JSON object (send Content-Type: application/json)")
            continue
        if tuple(err.get("loc", ())) == ("body",) and err.get("type") == "missing":
            parts.append("the request body is missing (a JSON object is required)")
            continue
        loc_parts = [str(x) for x in err.get("loc", ()) if not _is_union_tag(x)]
        loc = ".".join(loc_parts[1:] if loc_parts[:1] == ["body"] else loc_parts)
        msg = _finite_message(err) or str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(dict.fromkeys(parts)) or "invalid request"


def http_error_message(request: Request, exc: StarletteHTTPException) -> str:
    """Starlette's and FastAPI's own errors, said in terms of the request."""
    cause = exc.__cause__
    if exc.status_code == 405:
        allowed = ", ".join(allowed_methods(request)) or "none"
        return f"method {request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"no such endpoint: {request.method} {request.url.path}"
    if isinstance(cause, RecursionError):
        return "malformed JSON body: nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"malformed JSON body: not valid UTF-8 at byte {cause.start}"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        # Python refuses to parse integers beyond 4,300 digits (a CPU-exhaustion guard)
        return "malformed JSON body: an integer has more than 4300 digits"
    return str(exc.detail)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's Allow names one route's only)."""
    methods: set[str] = set()
    stack = list(request.app.routes)
    while stack:
        route = stack.pop()
        nested = getattr(route, "original_router", None) or getattr(route, "router", None)
        if nested is not None and hasattr(nested, "routes"):  # FastAPI's included routers
            stack.extend(nested.routes)
        elif isinstance(route, BaseRoute) and route.matches(request.scope)[0] is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods - {"HEAD"})


def _finite_message(err: Mapping[str, Any]) -> str | None:
    """JSON's 1e400 parses as infinity; say so rather than "not a valid number"."""
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number (values beyond +-1.8e308, like 1e400, are out of range)"
    return None


def _is_union_tag(part: object) -> bool:
    """Pydantic names union members in locations (`list[int]`, `str`); they say nothing to a user."""
    text = str(part)
    return "[" in text or text in {"str", "int", "float", "bool", "function-after"} or "function-" in text


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, format_validation_errors(list(exc.errors())), "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        response = error_response(exc.status_code, http_error_message(request, exc), type_)
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.type)

    @app.exception_handler(RadixAgentError)
    async def _engine(request: Request, exc: RadixAgentError) -> JSONResponse:
        status, type_, message = classify(exc)
        if status >= 500 and not isinstance(exc, (Overloaded, PoolExhausted, EngineClosed)):
            log.error("error serving %s: %r", request.url.path, exc)
        return error_response(status, message, type_)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("bug serving %s", request.url.path, exc_info=exc)
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")
