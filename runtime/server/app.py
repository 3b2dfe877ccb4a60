"""`create_app(engine, server_args)`: the SGLang-compatible HTTP server over an embedded engine."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.server.args import ServerArgs
from runtime.server.control import control_router
from runtime.server.debug import debug_router
from runtime.server.errors import error_response, install_handlers
from runtime.server.native import VERSION, native_router
from runtime.server.openai_api import openai_router
from runtime.server.state import ServerState

#: paths served without the API key
PUBLIC_PATHS = frozenset({"/health"})


def create_app(engine: Any, server_args: ServerArgs | None = None) -> FastAPI:
    """Build the app. The engine must be ready; the app never shuts it down (the caller owns it)."""
    args = server_args or ServerArgs()
    state = ServerState.build(engine, args)
    app = FastAPI(title="radixagent", version=VERSION)
    app.state.radixagent = state
    install_handlers(app)
    app.include_router(native_router(state))
    app.include_router(openai_router(state))
    app.include_router(control_router(state))
    if args.enable_debug_endpoints:
        app.include_router(debug_router(state))
    if args.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_bytes)  # outermost: runs first
    return app


class BodyLimitMiddleware:
    """413 for request bodies over `max_bytes`, declared (Content-Length) or streamed (chunked),
    before any route parses them: one huge body must not take the server's memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # no declared length: read (at most max_bytes + 1) first, then replay it to the app
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, f"request body over {self.max_bytes} bytes (--max-request-bytes)",
                                  "invalid_request_error")  # fmt: skip
        await response(scope, receive, send)


class ApiKeyMiddleware:
    """`Authorization: Bearer KEY` on every path but /health; checked before the body is read."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401, "invalid or missing API key (Authorization: Bearer KEY)", "authentication_error"
        )
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key)
