"""`create_app(engine, server_args)`: the SGLang-compatible HTTP server over an embedded engine."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.server.args import ServerArgs
from runtime.server.control import control_router
from runtime.server.debug import debug_router
from runtime.server.errors import error_response, install_handlers
from runtime.server.messages.errors import AnthropicErrorMiddleware
from runtime.server.native import VERSION, native_router
from runtime.server.openai_api import openai_router
from runtime.server.state import ServerState

if TYPE_CHECKING:
    from runtime.engine.engine import Engine

#: paths served without the API key
PUBLIC_PATHS = frozenset({"/health"})


def create_app(engine: Engine, server_args: ServerArgs | None = None) -> FastAPI:
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
    # add_middleware wraps: the last added runs first. Auth runs before the body limit, so a
    # request without a valid key is refused before a byte of its body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_bytes)
    if args.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key, admin_key=args.admin_api_key)
    if args.api_key is not None or args.admin_api_key is not None:
        from runtime.server.auth import AdminGate

        app.add_middleware(AdminGate, admin_key=args.admin_api_key)
    if args.trace_dir is not None:  # issue 19: X-Session-Id names a request's trace session
        from runtime.server.trace_dir import SessionHeaderMiddleware

        app.add_middleware(SessionHeaderMiddleware)
    app.add_middleware(AnthropicErrorMiddleware)  # outermost: every /v1/messages error in its shape
    return app


class BodyLimitMiddleware:
    """413 for request bodies over `max_bytes`, counting the bytes actually received whatever
    Content-Length or Transfer-Encoding declare, before any route parses them. A request that
    declares both framings is refused (400): front ends may read it differently (smuggling)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        names = [name for name, _ in scope.get("headers") or []]
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if b"transfer-encoding" in names and declared is not None:
            await _refuse(
                scope, receive, send, 400, "Content-Length and Transfer-Encoding together are refused"
            )
            return
        if names.count(b"content-length") > 1:
            await _refuse(scope, receive, send, 400, "more than one Content-Length header")
            return
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(scope, receive, send, 413, self._over)
            return
        # read (at most max_bytes + 1) whatever was declared, then replay it to the app
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await _refuse(scope, receive, send, 413, self._over)
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    @property
    def _over(self) -> str:
        return f"request body over {self.max_bytes} bytes (--max-request-bytes)"


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    # the unread body makes the connection unusable: say so rather than leave the client waiting
    response = error_response(status, message, "invalid_request_error")
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class ApiKeyMiddleware:
    """`Authorization: Bearer KEY` on every path but /health; checked before the body is read."""

    def __init__(self, app: ASGIApp, api_key: str, admin_key: str | None = None) -> None:
        self.app = app
        self.key = api_key.encode()
        self.admin_key = admin_key.encode() if admin_key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401, "invalid or missing API key (Authorization: Bearer KEY)", "authentication_error"
        )
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        """Exactly one Authorization header with the key: with two, proxies and this server could
        disagree on which one counts, so neither does."""
        headers = scope.get("headers") or []
        values = [v for name, v in headers if name == b"authorization"]
        keys = [v for name, v in headers if name == b"x-api-key"]  # Anthropic clients' header
        if len(values) + len(keys) != 1:
            return False
        if keys:
            return hmac.compare_digest(keys[0].strip(), self.key)
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = token.strip().encode()
        admin = self.admin_key is not None and hmac.compare_digest(given, self.admin_key)
        return admin or hmac.compare_digest(given, self.key)
