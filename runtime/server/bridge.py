"""Async face of the blocking engine: calls run in a bounded thread pool, streams step in it.

Engine calls block (prefill, decode). Running them in worker threads lets one event loop serve many
clients while the engine's own scheduler batches them. A stream is an engine generator pulled one
chunk per worker-thread call; when the client goes away the generator is closed, which aborts the
request in the engine and releases its KV locks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from runtime.engine.generation import GenerationRequest
from runtime.errors import Overloaded
from runtime.server.errors import classify, error_body

if TYPE_CHECKING:
    from runtime.engine.engine import Engine

Chunk = dict[str, Any]


def _checked(requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
    """The bridge runs request objects only: a route hands over what it built, never the
    keyword arguments it was built from (the requests are built and checked once, by the route)."""
    batch = list(requests) if isinstance(requests, (list, tuple)) else []
    if not batch or not all(isinstance(r, GenerationRequest) for r in batch):
        raise TypeError(
            f"EngineBridge runs a non-empty list of GenerationRequest objects, not {requests!r:.80}"
        )
    return batch


def _step(gen: Iterator[Chunk]) -> Chunk | None:
    """The next chunk, or None when the stream is over."""
    try:
        return next(gen)
    except StopIteration:
        return None


#: threads for short engine calls (stats, flush, session events, tokenizer, chat template): apart
#: from the generation threads, so these endpoints answer while every generation thread is busy
CONTROL_THREADS = 16


class EngineBridge:
    """Runs engine methods off the event loop.

    A generation call (a non-streaming request, or a stream until its first chunk) holds a thread
    for as long as the engine works on it: at most `max_threads` at once, and one more is refused
    with `Overloaded` (a 503) at once instead of waiting without bound for a thread. Stream steps
    (one per token, each brief) and control calls have thread pools of their own.
    """

    def __init__(self, engine: Engine, max_threads: int) -> None:
        self.engine = engine
        self.max_threads = max_threads
        self.generation = anyio.CapacityLimiter(max_threads)  # admission: never waited on
        self._generation_threads = anyio.CapacityLimiter(max_threads)
        self.steps = anyio.CapacityLimiter(max_threads)
        self.limiter = anyio.CapacityLimiter(CONTROL_THREADS)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A short engine call (control endpoints)."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self.limiter)

    async def _generation_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        borrower = object()
        try:
            self.generation.acquire_on_behalf_of_nowait(borrower)
        except anyio.WouldBlock:
            raise Overloaded(f"all {self.max_threads} generation threads are busy; retry later") from None
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._generation_threads)
        finally:
            self.generation.release_on_behalf_of(borrower)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Chunk]:
        """Run the requests a route built (`ServerState.requests`) as built, as one engine call
        (a batch is scheduled together): one result each, in order."""
        batch = _checked(requests)
        return await self._generation_call(self.engine.run, batch)

    async def open_stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Start a stream and wait for its first chunk, so that a bad request fails before any
        response byte is sent (a proper 4xx instead of an error inside a 200 stream)."""
        (request,) = _checked([request])
        return await self._generation_call(self._open, request)

    def _open(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        gen = self.engine.stream(request)
        try:
            first = _step(gen)
        except BaseException:
            gen.close()
            raise
        return self._chunks(gen, first)

    async def _step(self, gen: Iterator[Chunk]) -> Chunk | None:
        return await anyio.to_thread.run_sync(_step, gen, limiter=self.steps)

    async def _chunks(self, gen: Iterator[Chunk], first: Chunk | None) -> AsyncIterator[Chunk]:
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                chunk = await self._step(gen)
        finally:
            await self._close(gen)

    async def _close(self, gen: Iterator[Chunk]) -> None:
        close = getattr(gen, "close", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(close, limiter=self.steps)


async def close_stream(chunks: AsyncIterator[Chunk]) -> None:
    """Close a stream from `open_stream` now (client gone or response done), even while cancelled."""
    with anyio.CancelScope(shield=True):
        await chunks.aclose()  # type: ignore[attr-defined]


#: What str.splitlines takes for a line break and JSON leaves raw in a string (it escapes every
#: control character below 0x20): an event carrying one of them in generated or echoed text was
#: cut in two by clients that read lines that way (httpx's `aiter_lines`: a JSONDecodeError).
#: Escaped, the event is one line for every reader and decodes to the same text.
_LINE_BREAKS_JSON_KEEPS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(obj: object) -> bytes:
    """One server-sent event in SGLang's and OpenAI's format: one line of JSON."""
    text = json.dumps(obj, ensure_ascii=False).translate(_LINE_BREAKS_JSON_KEEPS)
    return b"data: " + text.encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(exc: BaseException) -> bytes:
    """An error met mid-stream (headers already sent): SGLang sends it as a data event."""
    status, type_, message = classify(exc)
    return sse(error_body(message, type_, status))
