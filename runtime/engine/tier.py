"""The engine's side of the KV tier (docs/tier.md): what a session event means for the prefetch
of its context, and the tier's figures in `Engine.get_cache_stats`. A side concern: requests do
not pass through here (the cache manager calls the tier's hooks itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tier's modules (and the redis client) load only when it is enabled
    from runtime.cache.tier.hooks import TierHooks

#: the tier's counters that `get_cache_stats` also reports flat, as `tier_<name>`
FLAT_STATS = (
    "hits",
    "loaded_tokens",
    "demoted_tokens",
    "bytes_read",
    "bytes_written",
    "load_time_s",
    "write_time_s",
    "corrupt_pages",
    "prefetched_tokens",
    "dropped_pages",
)


def on_session_event(tier: TierHooks, key: str, event: str, expected_s: float | None) -> bool:
    """Prefetch: a tool wait with an expected duration loads the session's context back just
    before it returns; `resume` (the tool returned) loads it now; close / abandon cancel.
    `key` is the salt-scoped session key. True when a prefetch was scheduled: the scheduler's
    worker must wake to time its wait to it."""
    if event == "tool_wait" and expected_s is not None:
        tier.schedule(key, float(expected_s))
        return True
    if event == "resume":
        tier.schedule(key, 0.0)
        return True
    if event in ("close", "abandon"):
        tier.cancel(key)
    return False


def tier_stats(tier: TierHooks | None) -> dict[str, object]:
    """`tier_<counter>` for the headline counters plus the whole `tier` dict; {} with no tier."""
    if tier is None:
        return {}
    t = tier.tier.stats()
    flat = {f"tier_{k}": t[k] for k in FLAT_STATS}
    flat["tier_write_queue_bytes"] = t.get("write_queue_bytes", 0)  # 0: writes are synchronous
    return {**flat, "tier": t}
