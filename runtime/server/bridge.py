"""Async face of the blocking engine: calls run in a bounded thread pool, streams step in it.

Engine calls block (prefill, decode). Running them in worker threads lets one event loop serve many
clients while the engine's own scheduler batches them. A stream is an engine generator pulled one
chunk per worker-thread call; when the client goes away the generator is closed, which aborts the
request in the engine and releases its KV locks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread

from runtime.server.errors import classify, error_body

Chunk = dict[str, Any]


def _step(gen: Iterator[Chunk]) -> Chunk | None:
    """The next chunk, or None when the stream is over."""
    try:
        return next(gen)
    except StopIteration:
        return None


class EngineBridge:
    """Runs engine methods off the event loop; at most `max_threads` at once."""

    def __init__(self, engine: Any, max_threads: int) -> None:
        self.engine = engine
        self.limiter = anyio.CapacityLimiter(max_threads)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self.limiter)

    async def generate(self, **kwargs: Any) -> Any:
        return await self.call(self.engine.generate, **kwargs)

    async def open_stream(self, **kwargs: Any) -> AsyncIterator[Chunk]:
        """Start a stream and wait for its first chunk, so that a bad request fails before any
        response byte is sent (a proper 4xx instead of an error inside a 200 stream)."""
        gen = await self.call(self.engine.generate_stream, **kwargs)
        try:
            first = await self.call(_step, gen)
        except BaseException:
            await self._close(gen)
            raise
        return self._chunks(gen, first)

    async def _chunks(self, gen: Iterator[Chunk], first: Chunk | None) -> AsyncIterator[Chunk]:
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                chunk = await self.call(_step, gen)
        finally:
            await self._close(gen)

    async def _close(self, gen: Iterator[Chunk]) -> None:
        close = getattr(gen, "close", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await self.call(close)


async def close_stream(chunks: AsyncIterator[Chunk]) -> None:
    """Close a stream from `open_stream` now (client gone or response done), even while cancelled."""
    with anyio.CancelScope(shield=True):
        await chunks.aclose()  # type: ignore[attr-defined]


def sse(obj: Any) -> bytes:
    """One server-sent event in SGLang's and OpenAI's format."""
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(exc: BaseException) -> bytes:
    """An error met mid-stream (headers already sent): SGLang sends it as a data event."""
    status, type_, message = classify(exc)
    return sse(error_body(message, type_, status))
