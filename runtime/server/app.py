"""`create_app(engine, server_args)`: the SGLang-compatible HTTP server over an embedded engine."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.server.args import ServerArgs
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
    if args.enable_debug_endpoints:
        app.include_router(debug_router(state))
    if args.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    return app


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
