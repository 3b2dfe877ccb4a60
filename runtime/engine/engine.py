"""The embedded engine: SGLang's offline-engine API over a compact model, a radix prefix cache
and a fixed KV pool. See docs/flow.md for one request's path through it."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from runtime.cache.namespace import Salt, namespace_key, session_key, split_salt
from runtime.config import EngineConfig
from runtime.engine import build as engine_build
from runtime.engine import stats as engine_stats
from runtime.engine.generation import GenerationRequest, is_batch
from runtime.engine.logprobs import LogprobState
from runtime.engine.request import Request
from runtime.engine.sampling import Sampler, SamplingParams
from runtime.engine.snapshot import EngineSnapshot
from runtime.engine.stats import EngineInfo
from runtime.engine.threads import in_fresh_thread
from runtime.engine.tier import on_session_event
from runtime.errors import Busy, EngineClosed, InvalidRequest, Overloaded, PromptTooLong, UnknownSession
from runtime.model import files as model_files

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from runtime.cache.kv_events.publisher import ZmqEventPublisher
    from runtime.cache.kv_pool import KVPool
    from runtime.cache.manager import RadixCacheManager
    from runtime.cache.radix import RadixCache
    from runtime.cache.sessions import SessionRegistry
    from runtime.cache.tier.hooks import TierHooks  # the tier loads only when it is enabled
    from runtime.engine.grammar import GrammarMatcher
    from runtime.engine.scheduler import Scheduler
    from runtime.model.hf_model import HFModel
    from runtime.model.model import LlamaModel

log = logging.getLogger("radixagent.engine")


def check_total_tokens(prompt_len: int, explicit: bool, sp: SamplingParams, context_length: int) -> None:
    """SGLang's check: an explicit max_new_tokens that cannot fit the context window is an error
    (an unset one is clamped later)."""
    if explicit and prompt_len + sp.max_new_tokens > context_length:
        raise PromptTooLong(
            f"max_new_tokens: requested {prompt_len + sp.max_new_tokens} tokens "
            f"({prompt_len} prompt + {sp.max_new_tokens} new) but the context window is "
            f"{context_length}; lower max_new_tokens (max_tokens) or the prompt"
        )


@dataclass(frozen=True, slots=True)
class Weights:
    """A model in memory with what the engine needs beside it."""

    model: LlamaModel | HFModel
    tokenizer: PreTrainedTokenizerBase
    path: str
    name: str
    eos_ids: set[int]


class Engine:
    """SGLang's offline `Engine` (runtime/ENGINE_API.md). Its parts are built by build.py;
    its figures come from stats.py; each request goes `_request` → scheduler → result."""

    def __init__(
        self,
        model_path: str | None = None,
        *,
        config: EngineConfig | None = None,
        weights: Weights | None = None,
        **options: Any,
    ) -> None:
        """`Engine(model_path, **options)` loads the model; `config` and `weights` are how
        `from_model` and `sibling` build one around weights already in memory."""
        self.config = config if config is not None else EngineConfig(model_path=model_path, **options)
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        started = time.perf_counter()
        # in a helper thread: keeps the caller's thread free of an OpenMP pool (runtime/engine/threads.py)
        in_fresh_thread(lambda: self._assemble(weights if weights is not None else self._load()))
        summary = engine_build.describe(self.config, self.model_name, self.pool, self.attention_backend)
        log.info("engine ready in %.1fs: %s", time.perf_counter() - started, summary)

    def _load(self) -> Weights:
        loaded = model_files.load(self.config.model_path, torch.float32)
        model = engine_build.build_model(self.config, loaded)
        self.config = engine_build.as_built(self.config, model)
        return Weights(model, loaded.tokenizer, loaded.path, loaded.name, engine_build.eos_ids(loaded))

    @classmethod
    def from_model(
        cls,
        model: LlamaModel | HFModel,
        tokenizer: PreTrainedTokenizerBase,
        name: str,
        eos_ids: set[int] | None = None,
        **config: Any,
    ) -> Engine:
        """An engine around weights built elsewhere (e.g. seeded random weights for GPU timing,
        where no model file can be brought). `tokenizer` needs `decode`; prompts then come as ids."""
        weights = Weights(model, tokenizer, f"built:{name}", name, set(eos_ids or ()))
        return cls(config=engine_build.config_for_model(model, name, **config), weights=weights)

    def sibling(self, **overrides: Any) -> Engine:
        """A second engine over the same weights with its own pool, cache and config overrides
        (e.g. the uncached baseline: `engine.sibling(disable_radix_cache=True)`). No reload."""
        shared = Weights(self.model, self.tokenizer, self.model_path, self.model_name, self.eos_ids)
        return Engine(config=engine_build.sibling_config(self.config, overrides), weights=shared)

    def _assemble(self, weights: Weights) -> None:
        """Everything but the weights (runtime/engine/build.py); runs in a helper thread."""
        model, tokenizer, eos_ids = weights.model, weights.tokenizer, weights.eos_ids
        self.model, self.tokenizer, self.model_path, self.eos_ids = model, tokenizer, weights.path, eos_ids
        self.model_name = self.config.served_model_name or weights.name
        mc = model.cfg
        self.context_length = min(self.config.context_length or mc.max_positions, mc.max_positions)
        parts = engine_build.build_cache(
            self.config, model, tokenizer, eos_ids, self.model_name, self.context_length
        )
        self.pool: KVPool = parts.pool
        self.sessions: SessionRegistry = parts.sessions
        self.manager: RadixCacheManager = parts.manager
        self.scheduler: Scheduler = parts.scheduler
        self.tier: TierHooks | None = parts.tier
        self.kv_events: ZmqEventPublisher | None = parts.events
        self._closed = False
        self._swap_lock = threading.Lock()  # update_weights_from_disk: one at a time

    @property
    def cache(self) -> RadixCache:
        """The radix tree (read-only use: the cache manager owns it)."""
        return self.manager.tree

    # ---- requests ---------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, object] | list[Mapping[str, object]] | None = None,
        cache_salt: Salt | list[Salt] = None,
        prefix_cache: bool = True,
        session_id: str | None = None,
        priority: int | None = None,
        rid: str | list[str] | None = None,
        **logprobs: object,
    ) -> dict | list[dict]:
        """SGLang-shaped result; a list of prompts (or of id lists) gives a list of results.

        `logprobs`: SGLang's `return_logprob`, `logprob_start_len`, `top_logprobs_num`,
        `return_text_in_logprobs` (each one value, or one per prompt); see runtime/engine/logprobs.py."""
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
        **logprobs: object,
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
        namespace = namespace_key(request.cache_salt)
        if self.kv_events is not None and request.prefix_cache:  # events carry the salt, not its digest
            self.kv_events.recorder.name(namespace, *split_salt(request.cache_salt))
        return Request(
            rid=request.rid or uuid.uuid4().hex,
            input_ids=ids,
            params=sp,
            namespace=namespace,
            prefix_cache=self.manager.shares(bool(request.prefix_cache)),
            session_id=session_key(request.cache_salt, request.session_id),
            priority=int(request.priority or 0),
            sampler=Sampler(sp, self.eos_ids),
            grammar=self._grammar(sp),
            logprob=LogprobState.requested(request.logprobs, len(ids)),
            tokenizer=self.tokenizer,  # decodes the logprobs' token texts
        )

    def _grammar(self, sp: SamplingParams) -> GrammarMatcher | None:
        if not (sp.json_schema or sp.regex or sp.ebnf or sp.lark):
            return None
        from runtime.engine.grammar import GrammarMatcher

        return GrammarMatcher.compile(self.tokenizer, sp.json_schema, sp.regex, ebnf=sp.ebnf, lark=sp.lark)

    # ---- control ----------------------------------------------------------------------
    def abort_request(
        self, rid: str = "", abort_all: bool = False, exact: bool = False, cache_salt: Salt = None
    ) -> int:
        """SGLang's abort: requests whose rid starts with `rid` (or all, with `abort_all`) stop at the
        next step; their callers get `finish_reason {"type": "abort"}` and the KV computed so far
        goes into the tree, as SGLang does. Returns how many requests were marked. `cache_salt`:
        only requests under that salt (a tenant aborting its own)."""
        if not abort_all and not rid:
            raise InvalidRequest("rid: give the request id to abort (or abort_all)")
        namespace = namespace_key(cache_salt) if cache_salt is not None else None
        return self.scheduler.abort(rid, abort_all, exact, namespace)

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
        from runtime.model.weights import check_load_format, load_compatible, preflight

        # one swap at a time: three concurrent loads once held +2.6 GiB; the second is a 409
        if not self._swap_lock.acquire(blocking=False):
            raise Busy("a weights update is already in progress")
        try:
            check_load_format(model_path, load_format)
            preflight(model_path, self.model)  # headers only: nothing big is read for a bad path
            started = time.perf_counter()
            model = in_fresh_thread(lambda: load_compatible(model_path, self.model, self.config))
            if abort_all_requests:
                self.scheduler.abort("", abort_all=True)
            swap = self.scheduler.swap_weights(model, timeout_s)
        finally:
            self._swap_lock.release()
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
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert isinstance(text, str)  # one id list: one string
        return text

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """`template_kwargs` become template variables (SGLang's `chat_template_kwargs`)."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        assert isinstance(text, str)  # tokenize=False: the rendered prompt
        return text

    def info(self) -> EngineInfo:
        """What this engine is: model, path, context length, weight bytes, config."""
        cfg = self.model.cfg
        return EngineInfo(
            model_path=self.model_path,
            served_model_name=self.model_name,
            context_length=self.context_length,
            vocab_size=cfg.vocab_size,
            eos_token_ids=tuple(sorted(self.eos_ids)),
            architecture=cfg.arch,
            weight_bytes=engine_stats.weight_bytes(self.model),
            config=self.config,
            kv_events=self.kv_events.describe() if self.kv_events is not None else None,
        )

    @property
    def model_info(self) -> dict[str, object]:
        """SGLang's `/get_model_info` body (`info().model_info()`)."""
        return self.info().model_info()

    @property
    def attention_backend(self) -> str:
        """What decode attention runs on (config.attention_backend as resolved at start-up)."""
        return self.scheduler.attention_backend

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
            self.scheduler.prefills.clear()  # the logits beside KV that is gone
            return True

    def session_event(self, session_id: str, event: str, **info: Any) -> None:
        """Sessions are scoped by `cache_salt`: another salt's session is an unknown one."""
        salt = info.pop("cache_salt", None)
        key = session_key(salt, session_id)
        with self.scheduler.lock:
            try:
                self.sessions.on_event(key, event, cache=self.cache, namespace=namespace_key(salt), **info)
            except UnknownSession:
                raise UnknownSession(f"session {session_id!r} is not open") from None  # never the scoped key
        if self.tier is not None and on_session_event(self.tier, key, event, info.get("expected_s")):
            self.scheduler.wake_worker()  # the worker times its wait to the prefetch

    def session_is_open(self, session_id: str, cache_salt: str | None = None) -> bool:
        with self.scheduler.lock:
            return self.sessions.is_open(session_key(cache_salt, session_id))

    def get_cache_stats(self) -> dict[str, Any]:
        with self.scheduler.lock:
            stats = engine_stats.cache_stats(self.config, self.scheduler, self.manager, self.pool, self.tier)
            return stats | engine_stats.kv_event_stats(self.kv_events) | self.sessions.counts()

    def snapshot(self, check: bool = False) -> EngineSnapshot:
        """One consistent read under the scheduler lock; with `check`, `check_integrity` too."""
        with self.scheduler.lock:
            error = None
            if check:
                try:
                    self.check_integrity()
                except AssertionError as exc:
                    error = str(exc) or "integrity check failed"
            return engine_stats.engine_snapshot(self.scheduler, self.manager, self.get_cache_stats(), error)

    def check_integrity(self) -> None:
        """Raises AssertionError when pool accounting, lock refs or slot ownership are broken."""
        with self.scheduler.lock:
            self.manager.check_integrity()
            assert len(self.manager.leases) == len(self.scheduler.running), "a lease outlived its request"

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.scheduler.close()
            if self.tier is not None:
                self.tier.close()
            if self.kv_events is not None:
                self.kv_events.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
