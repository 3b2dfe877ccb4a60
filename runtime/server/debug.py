"""`GET /debug/integrity` (only with `--enable-debug-endpoints`): the engine's cache invariants and
lock counts, for tests and soak runs that must prove no request leaked a lock or a KV slot.

Not for untrusted clients: the check walks the whole radix tree under the scheduler lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from runtime.server.state import ServerState

if TYPE_CHECKING:
    from runtime.engine.engine import Engine


def debug_router(state: ServerState) -> APIRouter:
    r = APIRouter()

    @r.get("/debug/integrity")
    async def integrity() -> dict[str, object]:
        return await state.bridge.call(integrity_report, state.engine)

    return r


def integrity_report(engine: Engine) -> dict[str, object]:
    """`check_integrity()` plus lock counts, from one consistent snapshot (the scheduler lock is
    reentrant, so the check runs under the same hold). `ok` is False with `error` set on a violation."""
    snap = engine.snapshot(check=True)
    return {
        "ok": snap.integrity_error is None,
        "error": snap.integrity_error,
        "locked_nodes": snap.locked_nodes,
        "lock_refs": snap.lock_refs,
        "protected_tokens": snap.cache.protected_tokens,
        "evictable_tokens": snap.cache.evictable_tokens,
        "running": snap.running,
        "queue_depth": snap.waiting,
        "pool_capacity_tokens": snap.cache.pool_capacity_tokens,
        "pool_free_tokens": snap.cache.pool_free_tokens,
    }
