"""Where the tier meets the engine: three small hooks the scheduler and radix tree call.

- `on_evict(node)`: the radix tree calls it for a leaf about to be evicted, while its slots (and
  its ancestors') still hold K/V. Session-aware: a node the session policy judges dead (every
  session that used it closed it or rolled back past it) is dropped, the rest demoted.
- `extend(cache, ids, namespace, adopt, ...)`: the cache manager calls it before matching a
  request. When the store continues the tree's resident prefix, the manager's `adopt` takes
  fresh pool slots, these pages are written into them and the manager inserts them into the
  tree, so the ordinary match that follows serves them. Returns the number
  of tokens loaded (reported as `cached_tokens_details.storage`).
- `on_publish(namespace, key, slots, present)`: with `write_through`, every published prefix is
  written at once (else nothing happens until eviction).
- Prefetch: `remember(session, namespace, tokens)` keeps each session's latest context;
  `schedule(session, delay_s)` asks for that context to be loaded back after `delay_s` (a tool
  wait's expected return minus a lead, or now on `resume`); the worker runs `run_due(...)` each
  loop turn, so every torch op stays on the engine's thread.

All hooks run on the scheduler's worker thread under its lock (like every tree operation).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from runtime.cache.kv_pool import KVPool
from runtime.cache.radix import EvictionPolicy, RadixCache, TreeNode
from runtime.cache.tier.file_store import FileStore
from runtime.cache.tier.keys import Fingerprint, weights_digest
from runtime.cache.tier.redis_store import RedisStore
from runtime.cache.tier.store import KVStore, log
from runtime.cache.tier.tier import Fetched, KVTier, TierConfig
from runtime.config import EngineConfig
from runtime.model.hf_model import HFModel
from runtime.model.model import LlamaModel
from runtime.private_files import key_file

#: The cache manager's `adopt` (runtime/cache/manager.py): key, have, n, namespace, priority,
#: session_id, fill(slots) -> tokens the tree gained. The tier never locks, allocates or inserts
#: itself: the manager owns that routine.
Adopt = Callable[[Sequence[int], int, int, str, int, str | None, Callable[[list[int]], None]], int]

#: sessions whose latest context is remembered for prefetch (least recently active dropped)
MAX_REMEMBERED = 4096
#: a prefetch that finds no room (running requests hold the pool) tries again this much later,
#: until its session's expected return
PREFETCH_RETRY_S = 0.1


def model_fingerprint(model: LlamaModel | HFModel, name: str, kv_format: str) -> Fingerprint:
    cfg = model.cfg
    desc = f"{name}|{model.dtype}|{getattr(model, 'torchao_config', None)}"
    geometry = (cfg.layers, cfg.kv_heads, cfg.head_dim)
    return Fingerprint.of(desc, kv_format, geometry, weights_digest(_tensors(model)))


def _tensors(
    obj: object, prefix: str = "", depth: int = 0, seen: set[int] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs reachable from a model object through attributes, lists and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 5:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if hasattr(obj, "state_dict") and callable(obj.state_dict) and depth > 0:
        return [(f"{prefix}.{k}", v) for k, v in obj.state_dict().items()]
    items: Iterable[tuple[object, object]]
    if isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(obj, dict):
        items = obj.items()
    else:
        fields = getattr(obj, "__dict__", None) or {
            s: getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)
        }
        items = fields.items()
    out: list[tuple[str, torch.Tensor]] = []
    for k, v in items:
        if _holds_weights(v):
            out += _tensors(v, f"{prefix}.{k}", depth + 1, seen)
        elif isinstance(owner := getattr(v, "__self__", None), torch.Tensor):  # a tensor's bound method
            out += _tensors(owner, f"{prefix}.{k}", depth + 1, seen)
    return out


def _holds_weights(v: object) -> bool:
    """Whether the walk enters `v`: containers, tensors, weight holders (callable ones too: the
    linear layers are callable dataclasses, and skipping callables once left the embedding, the
    lm_head and every projection out of the fingerprint), never functions or bound methods."""
    if isinstance(v, (torch.Tensor, list, tuple, dict)):
        return True
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return True
    if isinstance(v, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type)):
        return False
    return hasattr(v, "__dict__") or hasattr(v, "__slots__")


def make_store(config: EngineConfig) -> KVStore:
    """The backend named by an EngineConfig's hicache_* fields."""
    if config.hicache_storage_backend == "redis":
        return RedisStore(config.hicache_storage_url)
    size = int((config.hicache_size if config.hicache_size is not None else 4.0) * 2**30)
    return FileStore(_storage_dir(config), size)


def _storage_dir(config: EngineConfig) -> str:
    """The file backend's directory; runtime/config.py refuses a file tier without one (the
    TypeError is what Path(None) raised here before)."""
    if config.hicache_storage_dir is None:
        raise TypeError("hicache_storage_dir is required with hicache_storage_backend file")
    return config.hicache_storage_dir


def mac_key(config: EngineConfig) -> bytes:
    """The tier's page MAC key: derived from `hicache_mac_key` when set (every worker of a shared
    tier sets the same); else the file backend's own key file (created 0600 in its 0700 directory,
    so pages survive restarts and no other local user can forge one); else a fresh key per server."""
    if config.hicache_mac_key is not None:
        return hashlib.blake2b(
            config.hicache_mac_key.encode(), digest_size=32, person=b"radixagent-mac"
        ).digest()
    if config.hicache_storage_backend == "file":
        try:
            return key_file(Path(_storage_dir(config)) / ".tier-mac-key")
        except (OSError, ValueError) as exc:  # an unusable directory: the tier degrades, serving goes on
            log.warning("no tier key file (%s): pages are readable by this server only", exc)
            return os.urandom(32)
    log.warning("the redis tier has no --hicache-mac-key: its pages can be read back by this server only")
    return os.urandom(32)


class TierHooks:
    def __init__(
        self, tier: KVTier, demote_filter: Callable[[TreeNode], bool] | None = None, model_name: str = ""
    ) -> None:
        self.tier = tier
        self.model_name = model_name
        self.demote_filter = demote_filter
        self._contexts: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()
        self._due: dict[str, tuple[float, float]] = {}  # session -> (due, retry until)
        self._due_lock = threading.Lock()  # schedule() comes from API threads

    @property
    def backend(self) -> str:
        return self.tier.store.name

    def refingerprint(self, model: LlamaModel | HFModel) -> None:
        """After a weights swap: keys follow the new weights."""
        self.tier.set_fingerprint(model_fingerprint(model, self.model_name, self.tier.pool.fmt.name))

    # ---- pool -> store --------------------------------------------------------------------
    def on_evict(self, node: TreeNode) -> None:
        if self.demote_filter is not None and not self.demote_filter(node):
            self.tier.counters.dropped_tokens += len(node.key)
            return
        tokens, slots = _path(node)
        self.tier.demote(node.namespace, tokens, slots, start=len(tokens) - len(node.key))

    def on_publish(self, namespace: str, key: Sequence[int], slots: Sequence[int], present: int) -> None:
        if self.tier.config.write_policy == "write_through" and len(key) > present:
            self.tier.demote(namespace, key, slots, start=present)

    # ---- store -> pool --------------------------------------------------------------------
    def extend(
        self,
        cache: RadixCache,
        ids: Sequence[int],
        namespace: str,
        adopt: Adopt,
        priority: int = 0,
        session_id: str | None = None,
    ) -> int:
        """Load stored pages continuing the tree's prefix of `ids` through the cache manager's
        `adopt`; returns tokens loaded."""
        have = cache.cached_length(ids, namespace)
        got = self.tier.fetch(namespace, ids, have)
        if got is None:
            return 0

        def fill(slots: list[int]) -> None:
            began = time.perf_counter()
            _write(self.tier.pool, slots, got)
            self.tier.note_loaded(got, time.perf_counter() - began)

        return adopt(ids, have, got.tokens, namespace, priority, session_id, fill)

    # ---- prefetch -------------------------------------------------------------------------
    def remember(self, session: str, namespace: str, tokens: list[int]) -> None:
        self._contexts[session] = (namespace, tokens)
        self._contexts.move_to_end(session)
        while len(self._contexts) > MAX_REMEMBERED:
            self._contexts.popitem(last=False)

    def schedule(self, session: str, delay_s: float) -> float:
        """Ask for a prefetch `delay_s` from now; returns the delay actually used. It starts
        `prefetch_lead_s` plus twice the estimated load time early: a fixed lead alone (0.5 s)
        was shorter than loading a 2k-token context on a busy CPU (0.6-1.4 s measured), so the
        prefetch was still running when the tool returned and the next step waited for it."""
        if not self.tier.config.prefetch:
            return -1.0
        delay = max(0.0, delay_s - self.tier.config.prefetch_lead_s - 2.0 * self.load_estimate_s(session))
        now = time.monotonic()
        with self._due_lock:
            self._due[session] = (now + delay, now + max(delay, delay_s))
        return delay

    def load_estimate_s(self, session: str) -> float:
        """Seconds to load the session's remembered context at the load rate seen so far (0
        before any load)."""
        ctx = self._contexts.get(session)
        c = self.tier.counters
        if ctx is None or c.loaded_tokens == 0:
            return 0.0
        return len(ctx[1]) * c.load_time_s / c.loaded_tokens

    def cancel(self, session: str) -> None:
        with self._due_lock:
            self._due.pop(session, None)

    def next_due_in(self) -> float | None:
        with self._due_lock:
            if not self._due:
                return None
            return max(0.0, min(t for t, _ in self._due.values()) - time.monotonic())

    def run_due(self, cache: RadixCache, adopt: Adopt, room: Callable[[], int]) -> int:
        """Prefetch every session whose time has come; returns tokens loaded. A prefetch that
        cannot get the slots (the pool is held by running requests, nothing evictable) is
        retried every PREFETCH_RETRY_S until the session's expected return, without reading
        the store meanwhile: measured, a single try fired while another tenant's request held
        the pool and was lost, so the step after the tool loaded its context anyway. `adopt` and
        `room` are the cache manager's (it owns the slots)."""
        now = time.monotonic()
        with self._due_lock:
            due = [(s, until) for s, (t, until) in self._due.items() if t <= now]
            for s, _ in due:
                del self._due[s]
        loaded = 0
        for session, until in due:
            ctx = self._contexts.get(session)
            if ctx is None:
                continue
            namespace, tokens = ctx
            if not self._room_for(cache, room, tokens, namespace):
                self.tier.counters.prefetch_retries += 1
                if now + PREFETCH_RETRY_S <= until:
                    with self._due_lock:
                        self._due.setdefault(session, (now + PREFETCH_RETRY_S, until))
                continue
            n = self.extend(cache, tokens, namespace, adopt, session_id=session)
            self.tier.counters.prefetches += 1
            self.tier.counters.prefetched_tokens += n
            loaded += n
        if loaded:
            log.debug("prefetched %d tokens for %d sessions", loaded, len(due))
        return loaded

    def _room_for(
        self, cache: RadixCache, room: Callable[[], int], tokens: Sequence[int], namespace: str
    ) -> bool:
        """Whether the pages beyond the resident prefix could get slots now (free + evictable)."""
        page = self.tier.config.page_tokens
        need = len(tokens) // page * page - cache.cached_length(tokens, namespace)
        return need <= 0 or room() >= need

    def close(self) -> None:
        self.tier.close()


def _path(node: TreeNode | None) -> tuple[list[int], list[int]]:
    """Tokens and slots from the namespace root down to `node` (inclusive)."""
    keys, values = [], []
    while node is not None and node.parent is not None:
        keys.append(node.key)
        values.append(node.value)
        node = node.parent
    tokens = [t for k in reversed(keys) for t in k]
    slots = [s for v in reversed(values) for s in v]
    return tokens, slots


def _write(pool: KVPool, slots: list[int], got: Fetched) -> None:
    pos = 0
    for n, planes in got.chunks():
        pool.write(slots[pos : pos + n], *planes)
        pos += n


def default_write_policy(backend: str) -> str:
    """A local tier only helps after eviction (write_back costs nothing until then); another
    worker can only hit what was written, so a shared tier writes through."""
    return "write_through" if backend == "redis" else "write_back"


def build_hooks(
    config: EngineConfig, pool: KVPool, model: LlamaModel | HFModel, name: str, policy: EvictionPolicy
) -> TierHooks:
    """The tier an EngineConfig asks for. With the session policy, dead nodes are dropped."""
    from runtime.cache.session_policy import DEAD, SessionPolicy

    tier_config = TierConfig(
        backend=config.hicache_storage_backend,
        page_tokens=config.hicache_page_tokens,
        write_policy=config.hicache_write_policy or default_write_policy(config.hicache_storage_backend),
        prefetch=config.hicache_prefetch,
        write_queue_bytes=int(config.hicache_write_queue_mb * 2**20),
        mac_key=mac_key(config),
    )
    tier = KVTier(make_store(config), tier_config, pool, model_fingerprint(model, name, pool.fmt.name))
    demote_filter = None
    if isinstance(policy, SessionPolicy):
        demote_filter = lambda node: policy.get_priority(node)[0] != DEAD  # noqa: E731
    return TierHooks(tier, demote_filter, name)
