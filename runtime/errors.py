"""Typed errors of the runtime layer. Callers branch on the type, never on the message."""

from __future__ import annotations


class RadixAgentError(Exception):
    """Base of every error radixagent raises on purpose."""


class InvalidRequest(RadixAgentError, ValueError):
    """The request itself is wrong (bad sampling values, empty prompt, ...): a 400 on the server."""


class PromptTooLong(InvalidRequest):
    """The prompt (plus room for one new token) exceeds the context window or the whole KV pool."""


class UnknownSession(InvalidRequest):
    """A request or session event names a session that was never opened or is already closed."""


class GrammarError(InvalidRequest):
    """A json_schema / regex constraint could not be compiled."""


class PoolExhausted(RadixAgentError):
    """The KV pool cannot hold a request even after evicting every unlocked node."""


class Overloaded(RadixAgentError):
    """The engine's queue is full: a 503 on the server; retry later."""


class EngineClosed(RadixAgentError):
    """The engine was shut down; no further requests are served."""


class BackendError(RadixAgentError):
    """A backend (HTTP server, OpenAI-compatible endpoint) refused or failed a request.

    `status` is the HTTP status when there was one (None for connection failures);
    `retryable` says whether the client may try again (5xx, timeouts, refused connections).
    """

    def __init__(self, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable


class Busy(RadixAgentError):
    """An operation that runs one at a time is already running (a weights swap): HTTP 409."""
