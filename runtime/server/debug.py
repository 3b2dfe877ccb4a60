"""`GET /debug/integrity` (only with `--enable-debug-endpoints`): the engine's cache invariants and
lock counts, for tests and soak runs that must prove no request leaked a lock or a KV slot.

Not for untrusted clients: the check walks the whole radix tree under the scheduler lock.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from runtime.server.state import ServerState


def debug_router(state: ServerState) -> APIRouter:
    r = APIRouter()

    @r.get("/debug/integrity")
    async def integrity() -> dict[str, Any]:
        return await state.bridge.call(integrity_report, state.engine)

    return r


def integrity_report(engine: Any) -> dict[str, Any]:
    """`check_integrity()` plus lock counts, from one consistent snapshot (the scheduler lock is
    reentrant, so the check runs under the same hold). `ok` is False with `error` set on a violation."""
    with engine.scheduler.lock:
        try:
            engine.check_integrity()
            error = None
        except AssertionError as exc:
            error = str(exc) or "integrity check failed"
        nodes = engine.cache.nodes()
        return {
            "ok": error is None,
            "error": error,
            "locked_nodes": sum(1 for n in nodes if n.lock_ref > 0),
            "lock_refs": sum(n.lock_ref for n in nodes),
            "protected_tokens": engine.cache.protected_size,
            "evictable_tokens": engine.cache.evictable_size,
            "running": len(engine.scheduler.running),
            "queue_depth": len(engine.scheduler.waiting),
            "pool_capacity_tokens": engine.pool.size,
            "pool_free_tokens": engine.pool.available,
        }
