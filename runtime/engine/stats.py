"""The engine's figures, assembled from its parts: `get_cache_stats`'s dict, the `EngineSnapshot`
and `EngineInfo`. Read-only, called under the scheduler's lock; requests never pass through."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from runtime.config import EngineConfig
from runtime.engine.snapshot import EngineSnapshot
from runtime.engine.tier import tier_stats
from runtime.model.hf_model import HFModel

if TYPE_CHECKING:
    from runtime.cache.kv_events.publisher import ZmqEventPublisher
    from runtime.cache.kv_pool import KVPool
    from runtime.cache.manager import RadixCacheManager
    from runtime.cache.tier.hooks import TierHooks
    from runtime.engine.scheduler import Scheduler
    from runtime.model.model import LlamaModel


def cache_stats(
    config: EngineConfig,
    scheduler: Scheduler,
    manager: RadixCacheManager,
    pool: KVPool,
    tier: TierHooks | None,
) -> dict[str, Any]:
    """`Engine.get_cache_stats()`: request, tree, pool and tier figures. Under the lock."""
    cache, c, st = manager.tree, manager.tree.counters, scheduler.stats
    per_token = pool.capacity_bytes // pool.size
    return {
        "requests": st.requests,
        "prompt_tokens": st.prompt_tokens,
        "cached_tokens": st.cached_tokens,
        "hit_rate": st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
        "prefill_tokens_computed": st.prompt_tokens - st.cached_tokens,
        "completion_tokens": st.completion_tokens,
        "inserts": c.inserts,
        "evictions": c.evictions,
        "evicted_tokens": c.evicted_tokens,
        "match_time_mean_s": c.match_time_s / c.matches if c.matches else 0.0,
        "tokens_in_use": cache.total_size,
        "bytes_in_use": cache.total_size * per_token,
        "pool_capacity_tokens": pool.size,
        "pool_capacity_bytes": pool.capacity_bytes,
        "kv_cache_dtype": pool.fmt.name,
        "attention_backend": scheduler.attention_backend,
        "kv_bytes_per_token": per_token,
        "pool_free_tokens": pool.available,
        "queue_depth": scheduler.queued,
        "running": len(scheduler.running),
        "policy": config.radix_eviction_policy,
        "cache_enabled": not config.disable_radix_cache,
        **kv_memory(manager),
        # SGLang's live gauges (runtime/engine/meters.py) and control counters
        "evictable_tokens": cache.evictable_size,
        "gen_throughput": scheduler.meters.gen_throughput(time.perf_counter()),
        "last_prefill_hit_rate": scheduler.meters.last_prefill_hit_rate,
        "aborted_requests": scheduler.aborted,
        "weights_version": scheduler.weights_version,
        **tier_stats(tier),
    }


def kv_event_stats(events: ZmqEventPublisher | None) -> dict[str, int]:
    """Tree changes recorded / dropped (queue full) and batches sent by the KV-event publisher."""
    return {} if events is None else events.stats()


def kv_memory(manager: RadixCacheManager) -> dict[str, int]:
    """K/V bytes held: the preallocated pool only. Running requests read and write their K/V
    in the pool's slots (runtime/cache/request_kv.py), nothing is parked. Under the lock."""
    return {
        "kv_bytes_held": manager.snapshot().kv_bytes_held,
    }


def engine_snapshot(
    scheduler: Scheduler, manager: RadixCacheManager, stats: dict[str, object], integrity_error: str | None
) -> EngineSnapshot:
    """`Engine.snapshot()`: queue, cache and lock figures with `stats`, all under one hold of the
    scheduler's lock (the caller's)."""
    waiting = list(scheduler.waiting)
    nodes = manager.tree.nodes()
    return EngineSnapshot(
        running=len(scheduler.running),
        waiting=len(waiting),
        queued=scheduler.queued,
        waiting_tokens=sum(len(r.input_ids) for r in waiting),
        waiting_uncached_tokens=sum(len(r.input_ids) - scheduler.cached_prefix(r) for r in waiting),
        cache=manager.snapshot(),
        locked_nodes=sum(1 for n in nodes if n.lock_ref > 0),
        lock_refs=sum(n.lock_ref for n in nodes),
        stats=stats,
        integrity_error=integrity_error,
    )


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the engine is (`Engine.info()`): the server reads this, never the engine's parts."""

    model_path: str
    served_model_name: str
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    architecture: str
    #: bytes a decode step streams (linear layers and head); the HF fallback: all its parameters
    weight_bytes: int
    config: EngineConfig
    #: SGLang's `kv_events` block of /get_server_info (None: not publishing where routers can subscribe)
    kv_events: dict[str, object] | None = None

    def model_info(self) -> dict[str, object]:
        """SGLang's /get_model_info, plus what this engine adds."""
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "context_length": self.context_length,
            "vocab_size": self.vocab_size,
            "eos_token_ids": list(self.eos_token_ids),
            "dtype": self.config.dtype,
            "is_generation": True,
            "architecture": self.architecture,
            "device": self.config.device,
            "torchao_config": self.config.torchao_config or "",
        }

    def config_dict(self) -> dict[str, Any]:
        """The config for the wire; a field kept out of repr (the tier's MAC key) stays out."""
        return {f.name: _jsonable(getattr(self.config, f.name)) for f in fields(self.config) if f.repr}


def _jsonable(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)


def weight_bytes(model: LlamaModel | HFModel) -> int:
    """`EngineInfo.weight_bytes`: the compact model's own count, or every parameter of the HF model."""
    if isinstance(model, HFModel):
        return sum(p.numel() * p.element_size() for p in model.hf.parameters())
    return model.weight_bytes
