"""The shared tier: pages in Redis (or Valkey), so every worker of a cluster reads what any
worker demoted. Keys are `<prefix><page key>`; the page key already carries the model
fingerprint and the tenant's namespace (runtime/cache/tier/keys.py), so tenants never share.

Redis bounds itself: run it with `maxmemory` and `maxmemory-policy allkeys-lru` (a page that
Redis dropped is a miss, and a chain stops at its first missing page). `ttl_s` adds an expiry.

A down or restarted Redis never fails a request: after a connection error the store answers
misses without trying for `retry_s`, then tries again (redis-py reconnects on its own), and logs
once per kind of failure.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from runtime.cache.tier.store import KVStore

DEFAULT_PREFIX = "radixagent:kv:"


class RedisStore(KVStore):
    name = "redis"

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        ttl_s: float | None = None,
        timeout_s: float = 2.0,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        try:
            import redis
        except ImportError as exc:  # the optional extra
            raise ImportError(
                "hicache_storage_backend redis needs the redis client: pip install 'radixagent[tier]'"
            ) from exc
        self._errors = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.url, self.prefix, self.ttl_s = url, prefix, ttl_s
        self.retry_s, self.clock = retry_s, clock
        self._down_until = 0.0

    def _k(self, key: str) -> str:
        return self.prefix + key

    def _usable(self) -> bool:
        return self.clock() >= self._down_until

    def _failed(self, op: str, exc: Exception) -> None:
        self._down_until = self.clock() + self.retry_s
        self.warn(f"{op}:{type(exc).__name__}", "redis tier %s: %s failed: %s", self.url, op, exc)

    def get(self, key: str) -> bytes | None:
        self.counters.gets += 1
        if not self._usable():
            self.counters.get_failures += 1
            return None
        try:
            blob = self.client.get(self._k(key))
        except self._errors as exc:
            self.counters.get_failures += 1
            self._failed("get", exc)
            return None
        if not isinstance(blob, bytes):  # None: a miss (the client never decodes to str)
            self.counters.get_misses += 1
            return None
        self.counters.get_bytes += len(blob)
        return blob

    def put(self, key: str, blob: bytes) -> bool:
        if not self._usable():
            self.counters.put_failures += 1
            return False
        try:
            ex = None if self.ttl_s is None else max(1, int(self.ttl_s))
            self.client.set(self._k(key), blob, ex=ex)
        except self._errors as exc:
            self.counters.put_failures += 1
            self._failed("put", exc)
            return False
        self.counters.puts += 1
        self.counters.put_bytes += len(blob)
        return True

    def contains(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        if not self._usable():
            return [False] * len(keys)
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(self._k(key))
            return [bool(n) for n in pipe.execute()]
        except self._errors as exc:
            self._failed("exists", exc)
            return [False] * len(keys)

    def delete(self, key: str) -> None:
        self.counters.deletes += 1
        if not self._usable():
            return
        try:
            self.client.delete(self._k(key))
        except self._errors as exc:
            self._failed("delete", exc)

    def footprint(self) -> dict[str, int]:
        """Entries under our prefix (a SCAN: for reports, not the serving path) and Redis's
        own used memory."""
        try:
            entries = sum(1 for _ in self.client.scan_iter(match=self.prefix + "*", count=1000))
            used = int(self.client.info("memory").get("used_memory", -1))
        except self._errors:
            return {"entries": -1, "bytes": -1}
        return {"entries": entries, "bytes": used}

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
            self.client.close()
