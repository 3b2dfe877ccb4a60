"""Anthropic's error shape on /v1/messages*: `{"type": "error", "error": {"type", "message"}}`.

An outermost ASGI layer rewrites the server's `{"error": {...}}` answers there, so auth (401), body
limit (413), validation (400) and engine errors all come out in the shape the client parses."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/v1/messages"
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, body: bytes) -> tuple[int, bytes]:
    """(status, body): a full queue (our 503) is Anthropic's 529 overloaded_error."""
    status = 529 if status == 503 else status
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")
    kind = TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    out = {"type": "error", "error": {"type": kind, "message": message}}
    return status, json.dumps(out).encode()


class AnthropicErrorMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start.update(message)
                return
            if not start:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                await _flush(send, start, b"".join(chunks))

        await self.app(scope, receive, wrapped)


async def _flush(send: Send, start: dict[str, Any], body: bytes) -> None:
    status, out = anthropic_error(int(start["status"]), body)
    headers = [
        (k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")
    ]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": out})
