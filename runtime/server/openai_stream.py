"""Several engine streams as one: the choices of an OpenAI request with n > 1, interleaved as their
tokens come. Closing the merged stream (client gone) closes every engine stream, which aborts
their requests and releases their KV."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import anyio

from runtime.server.bridge import close_stream

Chunk = dict[str, Any]


async def merge_streams(streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[tuple[int, Chunk]]:
    """(index, chunk) pairs from every stream, in arrival order; an error in one ends all."""
    if len(streams) == 1:  # no tasks needed for the common case
        try:
            async for chunk in streams[0]:
                yield 0, chunk
        finally:
            await close_stream(streams[0])
        return
    queue: asyncio.Queue[tuple[int, Chunk | None, BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[Chunk]) -> None:
        try:
            async for chunk in stream:
                await queue.put((i, chunk, None))
            await queue.put((i, None, None))
        except Exception as exc:
            await queue.put((i, None, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, got, error = await queue.get()
            if error is not None:
                raise error
            if got is None:
                remaining -= 1
                continue
            yield i, got
    finally:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):  # a pump must leave its stream before it is closed
            await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await close_stream(stream)


async def close_merged(merged: AsyncIterator[tuple[int, Chunk]], streams: list[AsyncIterator[Chunk]]) -> None:
    """Close a merged stream and its parts, also when it never started (its own cleanup did not run)."""
    with anyio.CancelScope(shield=True):
        await merged.aclose()  # type: ignore[attr-defined]
        for stream in streams:
            await close_stream(stream)


async def chat_chunks(body: AsyncIterable[Any]) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of the chat route's own SSE `data:` lines ([DONE] ends it): what the
    Messages and Responses doors translate when they stream."""
    async for raw in body:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for line in text.split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])
