"""Per-request state on the engine's hot path, and the events a request streams back."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from runtime.cache.manager import Lease
from runtime.cache.seq_kv import SeqKV
from runtime.engine.logprobs import LogprobState
from runtime.engine.running_text import RunningText
from runtime.engine.sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from runtime.engine.grammar import GrammarMatcher


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Why a request ended; `as_dict()` is SGLang's `meta_info.finish_reason` on the wire."""

    type: Literal["stop", "length", "abort"]
    #: stop: the eos/stop token id or the stop string that matched; None when a grammar completed
    matched: int | str | None = None
    #: length: the tokens generated
    length: int = 0
    #: abort: a client's abort, or the error that ended the request
    message: str = "Aborted"

    def as_dict(self) -> dict[str, object]:
        if self.type == "abort":  # SGLang's FINISH_ABORT: a client abort, disconnect, closed stream, error
            return {"type": "abort", "message": self.message, "status_code": None, "err_type": None}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "stop", "matched": self.matched}


@dataclass(slots=True)
class Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    namespace: str
    #: whether the cache serves and keeps this request's prompt: decided once, by the engine, from
    #: the request's prefix_cache and the cache manager (the uncached baseline shares nothing)
    prefix_cache: bool
    session_id: str | None
    priority: int
    sampler: Sampler
    grammar: GrammarMatcher | None = None
    logprob: LogprobState | None = None  # set when the request asks for logprobs
    tokenizer: PreTrainedTokenizerBase | None = None  # decodes logprob token texts (return_text_in_logprobs)
    arrival: float = field(default_factory=time.perf_counter)
    # scheduling state
    cached_len: int = 0  # prompt tokens served from the cache (reported)
    lease: Lease | None = None  # its hold on the cache manager while it runs
    evicted_len: int = 0  # prompt tokens after cached_len the tree held and evicted (issue 19)
    tier_tokens: int = 0  # of which loaded from the KV tier's store for this request
    storage_backend: str | None = None  # the engine's tier backend, when it has one
    #: a logprob request that adopted a twin's prefill (runtime/engine/logprobs.py): served whole
    twin: bool = False
    output_ids: list[int] = field(default_factory=list)
    first_token_time: float | None = None
    finish_reason: FinishReason | None = None
    aborted: bool = False
    weights_version: int = 0  # the scheduler's weights when this request started (checked at insert)
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    done: threading.Event = field(default_factory=threading.Event)
    text: str = ""
    #: the running text's decode state (runtime/engine/running_text.py)
    running: RunningText = field(default_factory=RunningText)
    error: BaseException | None = None

    @property
    def kv(self) -> SeqKV | None:
        """This request's K/V buffer while it runs (the cache manager owns it)."""
        kv = self.lease.kv if self.lease is not None else None
        assert kv is None or isinstance(kv, SeqKV)
        return kv

    @property
    def prefilled(self) -> bool:
        return self.kv is not None and self.kv.length >= len(self.input_ids)

    def next_chunk(self, budget: int) -> list[int]:
        """The tokens this request feeds into the next forward step."""
        assert self.kv is not None
        if not self.prefilled:
            return self.input_ids[self.kv.length : self.kv.length + budget]
        return [self.output_ids[-1]]

    def meta_info(self, now: float) -> dict[str, Any]:
        meta = self._meta(now)
        if self.logprob is not None:
            meta.update(self.logprob.meta_info(self.input_ids, self.output_ids, self.tokenizer))
        return meta

    def _meta(self, now: float) -> dict[str, Any]:
        meta = {
            "id": self.rid,
            "prompt_tokens": len(self.input_ids),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_len,
            "finish_reason": None if self.finish_reason is None else self.finish_reason.as_dict(),
            "e2e_latency": now - self.arrival,
            "ttft": (self.first_token_time or now) - self.arrival,
            # misses (issue 19): why the rest was not cached (docs/compat.md)
            "evicted_prefix_tokens": self.evicted_len,
            # logprob requests match nothing, unless a twin computed their prompt
            "prefix_cache": self.prefix_cache and (self.logprob is None or self.twin),
        }
        if self.storage_backend is not None and self.cached_len:
            # SGLang HiCache's breakdown (present on a hit): pool, host memory (none here), storage
            meta["cached_tokens_details"] = {
                "device": self.cached_len - self.tier_tokens,
                "host": 0,
                "storage": self.tier_tokens,
                "storage_backend": self.storage_backend,
            }
        return meta

    def result(self, now: float) -> dict[str, Any]:
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self.meta_info(now)}
