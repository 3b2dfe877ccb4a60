"""The HTTP connection layer: uvicorn's h11 protocol with a read deadline, a connection limit and
JSON protocol errors.

uvicorn times out only idle keep-alive connections: a client that opens a connection and sends
its headers (or its body) a byte at a time is held forever, and nothing bounds how many such
connections there are. Here every request must arrive whole (headers and body) within
`timeout_read` seconds of its first byte (or of the connection opening); a connection past
`max_connections` is answered 503 and closed at once; a malformed request gets the API's JSON
error shape instead of uvicorn's plain text.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from runtime.server.args import ServerArgs

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


def raw_error(status: int, message: str, type_: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection (no request was parsed, so
    h11 cannot frame one)."""
    body = json.dumps({"error": {"message": message, "type": type_, "code": status}}).encode()
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, _REASONS[status], len(body))
    )
    return head + body


class GuardedH11Protocol(H11Protocol):
    """Set by `protocol_class`: the deadline and the limit are class attributes (uvicorn builds one
    protocol object per connection from the class)."""

    timeout_read: float = 30.0
    max_connections: int = 512

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(
                raw_error(
                    503, f"too many connections (limit {self.max_connections}); retry later", "overloaded"
                )
            )
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._receiving():
            self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY:
            self._arm()  # a pipelined request started and is still arriving

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_error(400, f"malformed HTTP request: {msg}", "invalid_request_error"))
        self.transport.close()

    def _receiving(self) -> bool:
        """True while a request's headers or body are still on their way."""
        if self.conn.their_state is h11.SEND_BODY:
            return True
        # IDLE with bytes buffered: headers begun but not complete
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

    def _arm(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.timeout_read, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # headers incomplete: no app is running, answer here
            message = f"request not received within {self.timeout_read:g} s (--timeout-read)"
            self.transport.write(raw_error(408, message, "invalid_request_error"))
        # mid-body the app may be reading: closing makes its receive() answer http.disconnect
        self.transport.close()


def protocol_class(args: ServerArgs) -> type[GuardedH11Protocol]:
    attrs = {"timeout_read": args.timeout_read, "max_connections": args.limit_concurrency}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attrs)


def uvicorn_config(app: Any, args: ServerArgs, **overrides: Any) -> uvicorn.Config:
    """uvicorn's config for `radixagent serve` (and tests that serve the same way)."""
    settings: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "log_level": args.log_level,
        "timeout_graceful_shutdown": 5,
        "timeout_keep_alive": args.timeout_keep_alive,
        "h11_max_incomplete_event_size": args.h11_max_incomplete_event_size,
        "http": protocol_class(args),
    }
    return uvicorn.Config(app, **{**settings, **overrides})
