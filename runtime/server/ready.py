"""Wait for a server process to answer: the one serve-and-wait helper of the cluster supervisor,
the evals that start `radixagent serve`, and the tests that do.

Polls `url + path` until `ready(response)`; the pause between polls starts at 50 ms and doubles
up to 0.5 s (a model-free stub is up in ~0.1 s, a model worker in tens of seconds). A process
that exits first, or a deadline that passes, is a `NotReady` naming which."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable

import httpx


class NotReady(RuntimeError):
    """The server exited before it answered, or did not answer in time."""


def healthy(response: httpx.Response) -> bool:
    return response.status_code == 200


def wait_ready(
    url: str,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    path: str = "/health",
    timeout_s: float = 300.0,
    ready: Callable[[httpx.Response], bool] = healthy,
) -> None:
    """Returns once `url + path` is ready; `proc` (when given) must stay alive meanwhile."""
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while True:
        if proc is not None and proc.poll() is not None:
            raise NotReady(f"the server at {url} exited with {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError, ValueError):  # not listening yet, or half-started
            if ready(httpx.get(url + path, timeout=5)):
                return
        if time.monotonic() > deadline:
            raise NotReady(f"the server at {url} was not ready at {path} within {timeout_s:.0f} s")
        time.sleep(pause)
        pause = min(0.5, pause * 2)
