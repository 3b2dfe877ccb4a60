"""How an `Engine` is put together from its `EngineConfig`: the forward (compact, or the HF
fallback), the K/V format, the pool, the cache manager over the radix tree, the scheduler and,
when enabled, the KV tier. Construction only: no request passes through this module."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from runtime.cache.kv_format import KVFormat
from runtime.cache.kv_pool import KVPool
from runtime.cache.manager import NoCacheManager, RadixCacheManager
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache
from runtime.cache.request_kv import PooledKV
from runtime.cache.sessions import SessionRegistry
from runtime.config import EngineConfig, check_pool_fits, derive_pool_size
from runtime.engine.scheduler import Scheduler
from runtime.errors import InvalidRequest
from runtime.model import files as model_files
from runtime.model.decode_kernel import DecodeKernel, KernelUnavailable
from runtime.model.hf_model import HFModel
from runtime.model.model import LlamaModel, ModelConfig, UnsupportedModel
from runtime.model.quant import QuantizationError

if TYPE_CHECKING:  # the tier's modules (and the redis client) load only when it is enabled
    from transformers import PreTrainedTokenizerBase

    from runtime.cache.kv_events.publisher import ZmqEventPublisher  # zmq, msgspec: when configured
    from runtime.cache.tier.hooks import TierHooks

log = logging.getLogger("radixagent.engine")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


#: what a sibling engine cannot change: it shares the weights
SHARED_WITH_SIBLINGS = frozenset({"model_path", "dtype", "device", "torchao_config"})


def config_for_model(model: LlamaModel | HFModel, name: str, **config: Any) -> EngineConfig:
    """`Engine.from_model`'s config: dtype, device and quantization are the built model's."""
    dtype, torchao = _weights_of(model)
    return EngineConfig(
        device=str(model.device), dtype=dtype, served_model_name=name, torchao_config=torchao, **config
    )


def _weights_of(model: LlamaModel | HFModel) -> tuple[str, str | None]:
    """The dtype name and torchao config a model was built with (the HF fallback has none)."""
    return next(k for k, v in DTYPES.items() if v == model.dtype), getattr(model, "torchao_config", None)


def sibling_config(config: EngineConfig, overrides: dict[str, Any]) -> EngineConfig:
    """`Engine.sibling`'s config: `config` with `overrides`, none of which may touch the weights."""
    if SHARED_WITH_SIBLINGS & overrides.keys():
        raise InvalidRequest(
            "a sibling shares the weights: model_path, dtype, device and torchao_config cannot change"
        )
    # a sibling publishes no KV events of its own unless asked: the endpoint is the first engine's
    return replace(config, **({"kv_events_config": None} | overrides))


def build_model(config: EngineConfig, loaded: model_files.LoadedModel) -> LlamaModel | HFModel:
    """The compact forward where the architecture has one, else HF transformers' (slower). The
    default weights (config.default_weights) fall back to float32 where they cannot be built;
    `as_built` then says so in the engine's config."""
    assert config.dtype is not None  # EngineConfig resolves the default in __post_init__
    dtype, device = DTYPES[config.dtype], config.device
    arch = loaded.hf_config.model_type
    try:
        cfg = ModelConfig.from_hf(loaded.hf_config)
    except UnsupportedModel as e:
        why = str(e)
    else:
        try:
            return LlamaModel(cfg, loaded.state_dict, dtype, device, config.torchao_config)
        except QuantizationError as e:
            if not config.default_weights:
                raise
            log.warning(
                "%s: the default %s does not fit (%s): float32 weights", arch, config.torchao_config, e
            )
            return LlamaModel(cfg, loaded.state_dict, torch.float32, device)
    if config.torchao_config and not config.default_weights:
        raise ValueError(f"torchao_config needs the compact forward; {arch} has none here ({why})")
    log.warning("%s has no compact forward (%s): using the HF transformers fallback (slower)", arch, why)
    return HFModel(loaded.hf_model, torch.float32 if config.default_weights else dtype, device)


def as_built(config: EngineConfig, model: LlamaModel | HFModel) -> EngineConfig:
    """`config` with the dtype and quantization `model` was built with (the default's fallback)."""
    dtype, torchao = _weights_of(model)
    if (dtype, torchao) == (config.dtype, config.torchao_config):
        return config
    return replace(config, dtype=dtype, torchao_config=torchao)


def decode_kernel(config: EngineConfig, model: LlamaModel | HFModel) -> DecodeKernel | None:
    """The native decode kernel unless the config asks for torch_native (or runs off the CPU).
    Asked for by name, a kernel that cannot be built is an error; by default PyTorch's attention
    takes over, with a warning that says why."""
    if isinstance(model, HFModel) and config.attention_backend == "native_cpu":
        raise ValueError(
            f"attention_backend native_cpu needs the compact forward; the HF fallback for {model.cfg.arch} "
            "runs transformers' own attention"
        )
    if config.attention_backend == "torch_native" or config.device != "cpu" or isinstance(model, HFModel):
        return None
    try:
        return DecodeKernel.load()
    except KernelUnavailable as e:
        if config.attention_backend == "native_cpu":
            raise ValueError(f"attention_backend native_cpu: {e}") from e
        log.warning("native decode attention unavailable (%s): using torch_native", e)
        return None


def eos_ids(loaded: model_files.LoadedModel) -> set[int]:
    """The tokenizer's EOS plus the model config's (one id or a list)."""
    ids = {loaded.tokenizer.eos_token_id}
    extra = getattr(loaded.hf_config, "eos_token_id", None)
    ids |= set(extra) if isinstance(extra, list) else {extra}
    ids.discard(None)
    return ids


def kv_format(config: EngineConfig, model: LlamaModel | HFModel) -> KVFormat:
    """The pool's K/V format; the HF fallback can only store K/V in its own dtype."""
    fmt = KVFormat.resolve(config.kv_cache_dtype, model.dtype, model.kv_dtype)
    if isinstance(model, HFModel) and config.enable_deterministic_inference:
        raise ValueError(
            f"enable_deterministic_inference needs the compact forward; the HF fallback for "
            f"{model.cfg.arch} runs transformers' own attention"
        )
    if isinstance(model, HFModel) and (fmt.converts or fmt.scaled):
        raise ValueError(
            f"kv_cache_dtype {fmt.name} needs the compact forward; the HF fallback for "
            f"{model.cfg.arch} stores K/V in its own dtype ({fmt.compute}): use auto"
        )
    return fmt


@dataclass(slots=True)
class CacheParts:
    """What `build_cache` makes; the engine keeps each as an attribute of the same name."""

    pool: KVPool
    sessions: SessionRegistry
    manager: RadixCacheManager
    scheduler: Scheduler
    tier: TierHooks | None
    events: ZmqEventPublisher | None


def build_cache(
    config: EngineConfig,
    model: LlamaModel | HFModel,
    tokenizer: PreTrainedTokenizerBase,
    eos: set[int],
    name: str,
    context_length: int,
) -> CacheParts:
    """Pool (sized from the config or the memory left), policy, manager, scheduler and tier.
    Allocates the pool: run it off the caller's thread (runtime/engine/threads.py)."""
    mc = model.cfg
    fmt = kv_format(config, model)
    per_token = fmt.bytes_per_token(mc.layers, mc.kv_heads, mc.head_dim)
    size = config.max_total_tokens or derive_pool_size(per_token, context_length, config.mem_fraction)
    check_pool_fits(size, per_token)
    pool = KVPool(size, mc.layers, mc.kv_heads, mc.head_dim, fmt, config.device)
    sessions = SessionRegistry(clock=time.monotonic)
    kwargs = {"sessions": sessions} if config.radix_eviction_policy == "session" else {}
    policy = make_policy(config.radix_eviction_policy, **kwargs)
    manager_cls = NoCacheManager if config.disable_radix_cache else RadixCacheManager
    manager = manager_cls(RadixCache(pool, policy), PooledKV(pool))
    scheduler = Scheduler(
        model,
        manager,
        tokenizer,
        eos_ids=eos,
        max_running=config.max_running_requests,
        chunk_size=config.chunked_prefill_size,
        sessions=sessions,
        deterministic=config.enable_deterministic_inference,
        decode_kernel=decode_kernel(config, model),
    )
    tier = None
    if config.enable_hierarchical_cache:  # the KV tier (runtime/cache/tier/hooks.py): the manager calls it
        from runtime.cache.tier.hooks import build_hooks

        tier = build_hooks(config, pool, model, name, policy)
        manager.attach_tier(tier)
    return CacheParts(pool, sessions, manager, scheduler, tier, kv_events(config, manager.tree))


def kv_events(config: EngineConfig, tree: RadixCache) -> ZmqEventPublisher | None:
    """The KV-event publisher watching `tree` (runtime/cache/kv_events/), when configured."""
    from runtime.cache.kv_events.config import parse_kv_events_config

    events = parse_kv_events_config(config.kv_events_config)
    if events is None:
        return None
    try:
        from runtime.cache.kv_events.publisher import start_publisher
    except ImportError as exc:  # pyzmq / msgspec: the `kv-events` extra
        raise ValueError(
            f"--kv-events-config needs pyzmq and msgspec (pip install 'radixagent[kv-events]'): {exc}"
        ) from None
    publisher = start_publisher(events, config.page_size, tree.roots)
    tree.observer = publisher.recorder
    return publisher


def describe(config: EngineConfig, name: str, pool: KVPool, attention: str) -> str:
    """The start-up log line's summary of what was built."""
    quant = f" {config.torchao_config}" if config.torchao_config else ""
    return (
        f"{name}, {config.dtype}{quant}, pool {pool.size} tokens ({pool.capacity_bytes / 2**20:.0f} MiB, "
        f"KV {pool.fmt.name} {pool.capacity_bytes // pool.size} B/token), "
        f"policy {config.radix_eviction_policy}, cache {'off' if config.disable_radix_cache else 'on'}"
        + (", deterministic inference" if config.enable_deterministic_inference else "")
        + f", attention {attention}"
    )
