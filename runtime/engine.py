"""The embedded engine: SGLang's offline-engine API over a compact model, a radix prefix cache
and a fixed KV pool. See docs/flow.md for one request's path through it."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from runtime import model_files
from runtime.cache.kv_format import KVFormat
from runtime.cache.kv_pool import KVPool
from runtime.cache.manager import NoCacheManager, RadixCacheManager
from runtime.cache.namespace import Salt, namespace_key, session_key
from runtime.cache.policies import make_policy
from runtime.cache.radix import RadixCache
from runtime.cache.request_kv import PooledKV
from runtime.config import EngineConfig, check_pool_fits, derive_pool_size
from runtime.errors import EngineClosed, InvalidRequest, Overloaded, PromptTooLong, UnknownSession
from runtime.generation import GenerationRequest, LogprobArgs, is_batch
from runtime.hf_model import HFModel
from runtime.logprobs import LogprobSpec, LogprobState
from runtime.model import SUPPORTED, LlamaModel, ModelConfig
from runtime.request import Request
from runtime.sampling import Sampler, SamplingParams
from runtime.scheduler import Scheduler
from runtime.snapshot import EngineSnapshot
from runtime.threads import in_fresh_thread

if TYPE_CHECKING:  # the tier's modules (and the redis client) load only when it is enabled
    from runtime.cache.tier.hooks import TierHooks

log = logging.getLogger("radixagent.engine")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_total_tokens(prompt_len: int, explicit: bool, sp: SamplingParams, context_length: int) -> None:
    """SGLang's check: an explicit max_new_tokens that cannot fit the context window is an error
    (an unset one is clamped later)."""
    if explicit and prompt_len + sp.max_new_tokens > context_length:
        raise PromptTooLong(
            f"max_new_tokens: requested {prompt_len + sp.max_new_tokens} tokens "
            f"({prompt_len} prompt + {sp.max_new_tokens} new) but the context window is "
            f"{context_length}; lower max_new_tokens (max_tokens) or the prompt"
        )


class Engine:
    def __init__(self, model_path: str | None = None, **config: Any) -> None:
        self.config = EngineConfig(model_path=model_path, **config)
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        started = time.perf_counter()
        in_fresh_thread(self._load)  # keeps the caller's thread free of an OpenMP pool (runtime/threads.py)
        log.info(
            "engine ready in %.1fs: %s, %s%s, pool %d tokens (%.0f MiB, KV %s %d B/token), policy %s, cache %s",
            time.perf_counter() - started,
            self.model_name,
            self.config.dtype,
            f" {self.config.torchao_config}" if self.config.torchao_config else "",
            self.pool.size,
            self.pool.capacity_bytes / 2**20,
            self.pool.fmt.name,
            self.kv_bytes_per_token,
            self.config.radix_eviction_policy,
            "off" if self.config.disable_radix_cache else "on",
        )

    def _load(self) -> None:
        loaded = model_files.load(self.config.model_path, torch.float32)
        model = self._build_model(loaded)
        self._assemble(model, loaded.tokenizer, loaded.path, loaded.name, self._eos_ids(loaded))

    def _build_model(self, loaded: model_files.LoadedModel) -> LlamaModel | HFModel:
        assert self.config.dtype is not None  # EngineConfig resolves the default in __post_init__
        dtype, device = DTYPES[self.config.dtype], self.config.device
        if loaded.hf_config.model_type in SUPPORTED:
            return LlamaModel(
                ModelConfig.from_hf(loaded.hf_config),
                loaded.state_dict,
                dtype,
                device,
                self.config.torchao_config,
            )
        if self.config.torchao_config:
            raise ValueError(
                f"torchao_config needs the compact forward; {loaded.hf_config.model_type} has none"
            )
        log.warning(
            "%s has no compact forward: using the HF transformers fallback (slower)",
            loaded.hf_config.model_type,
        )
        return HFModel(loaded.hf_model, dtype, device)

    @classmethod
    def from_model(
        cls,
        model: LlamaModel | HFModel,
        tokenizer: Any,
        name: str,
        eos_ids: set[int] | None = None,
        **config: Any,
    ) -> Engine:
        """An engine around weights built elsewhere (e.g. seeded random weights for GPU timing,
        where no model file can be brought). `tokenizer` needs `decode`; prompts then come as ids."""
        dtype = next(k for k, v in DTYPES.items() if v == model.dtype)
        engine = object.__new__(cls)
        engine.config = EngineConfig(
            device=str(model.device),
            dtype=dtype,
            served_model_name=name,
            torchao_config=getattr(model, "torchao_config", None),
            **config,
        )
        in_fresh_thread(lambda: engine._assemble(model, tokenizer, f"built:{name}", name, set(eos_ids or ())))
        return engine

    def sibling(self, **overrides: Any) -> Engine:
        """A second engine over the same weights with its own pool, cache and config overrides
        (e.g. the uncached baseline: `engine.sibling(disable_radix_cache=True)`). No reload."""
        if {"model_path", "dtype", "device", "torchao_config"} & overrides.keys():
            raise InvalidRequest(
                "a sibling shares the weights: model_path, dtype, device and torchao_config cannot change"
            )
        other = object.__new__(Engine)
        other.config = replace(self.config, **overrides)
        in_fresh_thread(
            lambda: other._assemble(
                self.model, self.tokenizer, self.model_path, self.model_name, self.eos_ids
            )
        )
        return other

    def _assemble(
        self, model: LlamaModel | HFModel, tokenizer: Any, path: str, name: str, eos_ids: set[int]
    ) -> None:
        self.model, self.tokenizer, self.model_path, self.eos_ids = model, tokenizer, path, eos_ids
        self.model_name = self.config.served_model_name or name
        mc = model.cfg
        self.context_length = min(self.config.context_length or mc.max_positions, mc.max_positions)
        self._setup_cache(mc, self._kv_format(model))
        self._closed = False

    def _kv_format(self, model: LlamaModel | HFModel) -> KVFormat:
        fmt = KVFormat.resolve(self.config.kv_cache_dtype, model.dtype, model.kv_dtype)
        if isinstance(model, HFModel) and (fmt.converts or fmt.scaled):
            raise ValueError(
                f"kv_cache_dtype {fmt.name} needs the compact forward; the HF fallback for "
                f"{model.cfg.arch} stores K/V in its own dtype ({fmt.compute}): use auto"
            )
        return fmt

    def _setup_cache(self, mc: ModelConfig, fmt: KVFormat) -> None:
        from runtime.cache.sessions import SessionRegistry

        cfg = self.config
        per_token = fmt.bytes_per_token(mc.layers, mc.kv_heads, mc.head_dim)
        size = cfg.max_total_tokens or derive_pool_size(per_token, self.context_length, cfg.mem_fraction)
        check_pool_fits(size, per_token)
        self.pool = KVPool(size, mc.layers, mc.kv_heads, mc.head_dim, fmt, cfg.device)
        self.sessions = SessionRegistry(clock=time.monotonic)
        kwargs = {"sessions": self.sessions} if cfg.radix_eviction_policy == "session" else {}
        policy = make_policy(cfg.radix_eviction_policy, **kwargs)
        manager = NoCacheManager if cfg.disable_radix_cache else RadixCacheManager
        self.manager = manager(RadixCache(self.pool, policy), PooledKV(self.pool))
        self.scheduler = Scheduler(
            self.model,
            self.manager,
            self.tokenizer,
            self.eos_ids,
            cfg.max_running_requests,
            cfg.chunked_prefill_size,
            self.sessions,
        )
        self.tier: TierHooks | None = None
        if cfg.enable_hierarchical_cache:  # the KV tier (runtime/cache/tier/hooks.py): the manager calls it
            from runtime.cache.tier.hooks import build_hooks

            self.tier = build_hooks(cfg, self.pool, self.model, self.model_name, policy)
            self.manager.attach_tier(self.tier)

    @property
    def cache(self) -> RadixCache:
        """The radix tree (read-only use: the cache manager owns it)."""
        return self.manager.tree

    @staticmethod
    def _eos_ids(loaded: model_files.LoadedModel) -> set[int]:
        ids = {loaded.tokenizer.eos_token_id}
        extra = getattr(loaded.hf_config, "eos_token_id", None)
        ids |= set(extra) if isinstance(extra, list) else {extra}
        ids.discard(None)
        return ids

    # ---- requests ---------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
        cache_salt: Salt | list[Salt] = None,
        prefix_cache: bool = True,
        session_id: str | None = None,
        priority: int | None = None,
        rid: str | list[str] | None = None,
        **logprobs: Any,
    ) -> dict | list[dict]:
        """SGLang-shaped result; a list of prompts (or of id lists) gives a list of results.

        `logprobs`: SGLang's `return_logprob`, `logprob_start_len`, `top_logprobs_num`,
        `return_text_in_logprobs` (each one value, or one per prompt); see runtime/logprobs.py."""
        reqs = GenerationRequest.batch(
            prompt,
            input_ids,
            sampling_params,
            cache_salt,
            rid,
            prefix_cache=prefix_cache,
            session_id=session_id,
            priority=priority,
            **logprobs,
        )
        results = self.run(reqs)
        return results if is_batch(prompt, input_ids) else results[0]

    def run(self, requests: Sequence[GenerationRequest]) -> list[dict]:
        """Run requests built elsewhere (a backend, the server): one result each, in order."""
        reqs = [self._request(r) for r in requests]
        self._submit(reqs)
        return [self._wait(r) for r in reqs]

    def generate_stream(
        self,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        sampling_params: dict | None = None,
        cache_salt: Salt = None,
        prefix_cache: bool = True,
        session_id: str | None = None,
        priority: int | None = None,
        rid: str | None = None,
        **logprobs: Any,
    ) -> Iterator[dict]:
        """Yields cumulative results per token; closing the iterator early aborts the request."""
        if is_batch(prompt, input_ids):
            raise InvalidRequest("streaming takes a single prompt")
        (req,) = GenerationRequest.batch(
            prompt,
            input_ids,
            sampling_params,
            cache_salt,
            rid,
            prefix_cache=prefix_cache,
            session_id=session_id,
            priority=priority,
            **logprobs,
        )
        return self.stream(req)

    def stream(self, request: GenerationRequest) -> Generator[dict, None, None]:
        """`generate_stream` for a request built elsewhere. Validates before returning."""
        req = self._request(request)
        self._submit([req])
        return self._stream(req)

    def _stream(self, req: Request) -> Generator[dict, None, None]:
        try:
            while True:
                kind, payload = req.events.get()
                if kind == "done" and req.error is not None:
                    raise req.error
                yield payload
                if kind == "done":
                    return
        finally:
            if not req.done.is_set():
                req.aborted = True  # the scheduler releases its locks on the next step

    def _ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt is not None:
            ids = self.tokenize(request.prompt)
        else:
            ids = list(request.input_ids or ())
            vocab = self.model.cfg.vocab_size
            if not all(0 <= t < vocab for t in ids):
                raise InvalidRequest(f"input_ids must be integers in [0, {vocab})")
        if not ids:
            raise InvalidRequest("the prompt is empty")
        return ids

    def _request(self, request: GenerationRequest) -> Request:
        """The engine's checks, once per request: length, sampling values, grammar, logit_bias."""
        ids = self._ids(request)
        params = request.sampling_params
        sp = SamplingParams.from_dict(dict(params))
        room = min(self.context_length, self.pool.size) - len(ids)
        if room < 1:
            raise PromptTooLong(
                f"prompt has {len(ids)} tokens; the limit is "
                f"{min(self.context_length, self.pool.size) - 1} (context {self.context_length}, "
                f"KV pool {self.pool.size})"
            )
        check_total_tokens(len(ids), params.get("max_new_tokens") is not None, sp, self.context_length)
        # An unset max_new_tokens (or a pool smaller than the context) is clamped, as SGLang's scheduler does.
        if sp.max_new_tokens > room:
            sp = replace(sp, max_new_tokens=room)
        bad = [k for k in (sp.logit_bias or {}) if int(k) >= self.model.cfg.vocab_size]
        if bad:
            raise InvalidRequest(
                f"logit_bias: token ids out of range [0, {self.model.cfg.vocab_size}): {bad[:5]}"
            )
        req = Request(
            rid=request.rid or uuid.uuid4().hex,
            input_ids=ids,
            params=sp,
            namespace=namespace_key(request.cache_salt),
            use_cache=bool(request.prefix_cache),
            session_id=session_key(request.cache_salt, request.session_id),
            priority=int(request.priority or 0),
            sampler=Sampler(sp, self.eos_ids),
            grammar=self._grammar(sp),
        )
        self._attach_logprobs(req, request.logprobs)
        return req

    def _grammar(self, sp: SamplingParams) -> Any | None:
        if not (sp.json_schema or sp.regex or sp.ebnf or sp.lark):
            return None
        from runtime.grammar import GrammarMatcher

        return GrammarMatcher.compile(self.tokenizer, sp.json_schema, sp.regex, ebnf=sp.ebnf, lark=sp.lark)

    def _attach_logprobs(self, req: Request, args: LogprobArgs) -> None:
        if not args.return_logprob:
            return  # as SGLang: the other logprob arguments mean nothing without it
        spec = LogprobSpec.resolve(
            len(req.input_ids),
            args.logprob_start_len,
            args.top_logprobs_num,
            bool(args.return_text_in_logprobs),
        )
        req.logprob = LogprobState(spec, len(req.input_ids))
        req.tokenizer = self.tokenizer

    # ---- control ----------------------------------------------------------------------
    def abort_request(self, rid: str = "", abort_all: bool = False) -> int:
        """SGLang's abort: requests whose rid starts with `rid` (or all, with `abort_all`) stop at the
        next step; their callers get `finish_reason {"type": "abort"}` and the KV computed so far
        goes into the tree, as SGLang does. Returns how many requests were marked."""
        if not abort_all and not rid:
            raise InvalidRequest("rid: give the request id to abort (or abort_all)")
        return self.scheduler.abort(rid, abort_all)

    def update_weights_from_disk(
        self,
        model_path: str,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Load other weights of the same architecture and invalidate the whole cache (SGLang's
        endpoint). Requests running now finish under the old weights (or are aborted with
        `abort_all_requests`) and never insert into the new tree; queued ones run on the new
        weights. Returns SGLang's `{success, message, num_paused_requests}`."""
        from runtime.weights import check_load_format, load_compatible

        check_load_format(model_path, load_format)
        started = time.perf_counter()
        model = in_fresh_thread(lambda: load_compatible(model_path, self.model, self.config))
        if abort_all_requests:
            self.scheduler.abort("", abort_all=True)
        swap = self.scheduler.swap_weights(model, timeout_s)
        self.model, self.model_path = model, str(model_path)
        self.weights_loaded_s = time.perf_counter() - started
        return {
            "success": True,
            "num_paused_requests": swap.paused,
            "message": f"Succeeded to update model weights from {model_path} in {self.weights_loaded_s:.1f}s; "
            "the prefix cache was invalidated.",
        }

    @property
    def weights_version(self) -> int:
        return self.scheduler.weights_version

    def _submit(self, reqs: list[Request]) -> None:
        if self._closed:
            raise EngineClosed("the engine was shut down")
        if len(reqs) > self.config.max_queue:  # a retry could never succeed: not a 503
            raise InvalidRequest(
                f"a batch of {len(reqs)} prompts exceeds the queue bound ({self.config.max_queue}, "
                "--max-queue): split it"
            )
        if self.scheduler.queued + len(reqs) > self.config.max_queue:
            raise Overloaded(f"queue full ({self.config.max_queue} waiting requests)")
        for req in reqs:
            self.scheduler.submit(req)

    def _wait(self, req: Request) -> dict:
        req.done.wait()
        if req.error is not None:
            raise req.error
        return req.result(time.perf_counter())

    # ---- tokenizer --------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """`template_kwargs` become template variables (SGLang's `chat_template_kwargs`)."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )

    @property
    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "served_model_name": self.model_name,
            "context_length": self.context_length,
            "vocab_size": self.model.cfg.vocab_size,
            "eos_token_ids": sorted(self.eos_ids),
            "dtype": self.config.dtype,
            "is_generation": True,
            "architecture": self.model.cfg.arch,
            "device": self.config.device,
            "torchao_config": self.config.torchao_config or "",
        }

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one cached token takes in the pool (K and V of every layer, scales included)."""
        return self.pool.capacity_bytes // self.pool.size

    # ---- cache control ------------------------------------------------------------------
    def flush_cache(self) -> bool:
        """Empty the tree and return every slot; False (nothing done) while requests run, as SGLang."""
        with self.scheduler.lock:
            if self.scheduler.running or self.scheduler.queued:
                return False
            self.manager.reset()
            return True

    def session_event(self, session_id: str, event: str, **info: Any) -> None:
        """Sessions are scoped by `cache_salt`: another salt's session is an unknown one."""
        salt = info.pop("cache_salt", None)
        with self.scheduler.lock:
            try:
                self.sessions.on_event(
                    session_key(salt, session_id),
                    event,
                    cache=self.cache,
                    namespace=namespace_key(salt),
                    **info,
                )
            except UnknownSession:
                raise UnknownSession(f"session {session_id!r} is not open") from None  # never the scoped key
        if self.tier is not None:
            self._tier_session_event(session_key(salt, session_id), event, info.get("expected_s"))

    def _tier_session_event(self, key: str, event: str, expected_s: Any) -> None:
        """Prefetch: a tool wait with an expected duration loads the session's context back just
        before it returns; `resume` (the tool returned) loads it now; close / abandon cancel."""
        assert self.tier is not None
        if event == "tool_wait" and expected_s is not None:
            self.tier.schedule(key, float(expected_s))
        elif event == "resume":
            self.tier.schedule(key, 0.0)
        elif event in ("close", "abandon"):
            self.tier.cancel(key)
            return
        else:
            return
        self.scheduler._wake_worker()  # the worker times its wait to the prefetch

    def session_is_open(self, session_id: str, cache_salt: str | None = None) -> bool:
        with self.scheduler.lock:
            return self.sessions.is_open(session_key(cache_salt, session_id))

    def get_cache_stats(self) -> dict[str, Any]:
        with self.scheduler.lock:
            c, st = self.cache.counters, self.scheduler.stats
            per_token = self.kv_bytes_per_token
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
                "tokens_in_use": self.cache.total_size,
                "bytes_in_use": self.cache.total_size * per_token,
                "pool_capacity_tokens": self.pool.size,
                "pool_capacity_bytes": self.pool.capacity_bytes,
                "kv_cache_dtype": self.pool.fmt.name,
                "kv_bytes_per_token": per_token,
                "pool_free_tokens": self.pool.available,
                "queue_depth": self.scheduler.queued,
                "running": len(self.scheduler.running),
                "policy": self.config.radix_eviction_policy,
                "cache_enabled": not self.config.disable_radix_cache,
                **self._kv_memory(),
                # SGLang's live gauges (runtime/meters.py) and control counters
                "evictable_tokens": self.cache.evictable_size,
                "gen_throughput": self.scheduler.meters.gen_throughput(time.perf_counter()),
                "last_prefill_hit_rate": self.scheduler.meters.last_prefill_hit_rate,
                "aborted_requests": self.scheduler.aborted,
                "weights_version": self.scheduler.weights_version,
                **self._tier_stats(),
            }

    def _tier_stats(self) -> dict[str, Any]:
        if self.tier is None:
            return {}
        t = self.tier.tier.stats()
        flat = {
            f"tier_{k}": t[k]
            for k in (
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
        }
        flat["tier_write_queue_bytes"] = t.get("write_queue_bytes", 0)  # 0: writes are synchronous
        return {**flat, "tier": t}

    def _kv_memory(self) -> dict[str, int]:
        """K/V bytes held: the preallocated pool only. Running requests read and write their K/V
        in the pool's slots (runtime/cache/request_kv.py), nothing is parked. Under the lock."""
        return {
            "kv_request_buffer_bytes": 0,
            "kv_parked_buffer_bytes": 0,
            "kv_bytes_held": self.manager.snapshot().kv_bytes_held,
        }

    def snapshot(self, check: bool = False) -> EngineSnapshot:
        """One consistent read under the scheduler lock; with `check`, `check_integrity` too."""
        sched = self.scheduler
        with sched.lock:
            error = None
            if check:
                try:
                    self.check_integrity()
                except AssertionError as exc:
                    error = str(exc) or "integrity check failed"
            waiting = list(sched.waiting)
            nodes = self.manager.tree.nodes()
            return EngineSnapshot(
                running=len(sched.running),
                waiting=len(waiting),
                queued=sched.queued,
                waiting_tokens=sum(len(r.input_ids) for r in waiting),
                waiting_uncached_tokens=sum(len(r.input_ids) - sched.cached_prefix(r) for r in waiting),
                cache=self.manager.snapshot(),
                locked_nodes=sum(1 for n in nodes if n.lock_ref > 0),
                lock_refs=sum(n.lock_ref for n in nodes),
                stats=self.get_cache_stats(),
                integrity_error=error,
            )

    def check_integrity(self) -> None:
        """Raises AssertionError when pool accounting, lock refs or slot ownership are broken."""
        with self.scheduler.lock:
            self.manager.check_integrity()
            assert len(self.manager.leases) == len(self.scheduler.running), "a lease outlived its request"

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.scheduler.close()
            tier = getattr(self, "tier", None)  # absent when start-up failed before the tier
            if tier is not None:
                tier.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
