"""Bounded retries for HTTP backends: connection failures, timeouts and 5xx are retried with
exponential backoff; a 4xx is final at once.

Backoff 0.5 s, 1 s, 2 s, 4 s (capped): the default 4 attempts wait 3.5 s in all, which covers
sglang-router's detection of a dead worker in a `radixagent cluster` (health check every 1 s,
unhealthy after 2 failures; see docs/cluster.md, "Faults"). The first wait is the backends'
`retry_backoff_s` (tests against loopback fault servers shorten it)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from runtime.errors import BackendError

T = TypeVar("T")


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, BackendError) and exc.retryable


def with_retries(
    fn: Callable[[], T],
    attempts: int,
    backoff_s: float = 0.5,
    max_wait_s: float = 4.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn` up to `attempts` times while it raises a retryable `BackendError`; re-raise the last.
    Waits `backoff_s`, then twice as long each time, at most `max_wait_s`."""
    retrying = Retrying(
        retry=retry_if_exception(is_retryable),
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_exponential(multiplier=backoff_s, max=max_wait_s),
        sleep=sleep,
        reraise=True,
    )
    return retrying(fn)


def transport_error(exc: httpx.HTTPError, url: str) -> BackendError:
    """A `BackendError` for a request that got no HTTP answer (refused, reset, timed out)."""
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    return BackendError(f"request to {url} {kind}: {type(exc).__name__}: {exc}", status=None, retryable=True)


def status_error(status: int, body: str, url: str) -> BackendError:
    """A `BackendError` for an HTTP error answer, carrying the server's own message."""
    return BackendError(
        f"{url} answered {status}: {server_message(body)}", status=status, retryable=status >= 500
    )


def server_message(body: str) -> str:
    """The `error.message` of an OpenAI/SGLang error body, else the body itself (shortened)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
    return str(data)[:500]
