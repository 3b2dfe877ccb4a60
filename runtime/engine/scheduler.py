"""The engine's step loop: admit waiting requests against the KV pool, run one forward over
every running request (decode tokens plus prefill chunks), sample, and release finished ones.

Only the worker thread touches the tree, the pool and running requests, always under
`self.lock`; other threads enqueue requests and read events. The worker exits after
`IDLE_EXIT_S` without work and the next submit starts a new one (see runtime/engine/threads.py).

The worker is a daemon thread, so it must be gone before the interpreter finalizes: a daemon
thread that re-takes the GIL after finalization began is ended by `pthread_exit`, whose forced
unwind through torch's C++ frames (e.g. a tensor's dealloc, which drops the GIL to free its
storage) calls std::terminate and aborts the process (exit 134). An atexit hook (atexit runs
before finalization) closes every live scheduler and joins its worker.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from runtime.cache.manager import Lease, RadixCacheManager
from runtime.engine.logprobs import PrefillMemo, PrefillRecord
from runtime.engine.meters import ServeMeters
from runtime.engine.request import FinishReason, Request
from runtime.engine.sampling import SamplingParams
from runtime.errors import EngineClosed, InvalidRequest, PoolExhausted
from runtime.model.decode_kernel import DecodeKernel
from runtime.model.hf_model import HFModel
from runtime.model.model import LlamaModel, Segment
from runtime.trace.ledger import common_prefix

log = logging.getLogger("radixagent.scheduler")


#: shared uncached tokens worth waiting for instead of computing them twice
MIN_SHARED_PREFIX = 32
#: longest-prefix-first ordering sorts at most this many waiting requests (beyond: arrival order),
#: as SGLang's LPM policy does: a tree walk per waiting request per step must stay cheap
LPM_MAX_QUEUE = 128
#: an idle worker thread exits (freeing its OpenMP pool) after this long; restarting costs ~0.2 ms.
#: Short: engines that take turns (siblings, cached and uncached runs) hold two pools, and so run
#: throttled, only this long after each switch (at 1 s a 2k-context decode alternating between
#: two siblings ran ~85 tok/s instead of ~200, AMD EPYC, 2 cores)
IDLE_EXIT_S = 0.05
#: how long closing waits for the worker: it stops after the step in progress (one chunk)
CLOSE_JOIN_S = 60.0
#: what a tokenizer's decode shows for a character whose bytes are not all generated yet
INCOMPLETE = "\ufffd"
#: places per stop string and step where a held-back tail may start (stop_tail)
STOP_TAIL_TRIES = 8
#: characters before the previous step's text end that a stop search also reads: decoding more
#: tokens can rewrite the last few characters (a multi-byte character completed)
STOP_SLACK = 16


def _stop_hit(text: str, before: int, params: SamplingParams) -> tuple[int, str] | None:
    """The first stop string found where it can be new, and where it starts. Only a match that
    ends past the previous step's text is new (an older one stopped the request then): each step
    searches a window of the longest stop's length, not the whole output."""
    if not params.stop:
        return None
    start = max(0, min(before, len(text)) - max(map(len, params.stop)) - STOP_SLACK)
    for stop in params.stop:
        cut = text.find(stop, start)
        if cut >= 0:
            return cut, stop
    return None


def _streamable(text: str, params: SamplingParams) -> str:
    """What a running request's events may show of its text: each event's text a prefix of every
    later one and of the finished text, because clients append the text past what they were sent
    and cannot take any back. So not a trailing character whose bytes are still arriving (it
    decodes as U+FFFD until its last byte), nor a tail that could begin a stop string the finished
    text will cut off."""
    text = text.rstrip(INCOMPLETE)
    if params.stop and not params.no_stop_trim:
        text = text[: len(text) - max(stop_tail(text, s) for s in params.stop)]
    return text


def stop_tail(text: str, stop: str) -> int:
    """How many trailing characters of `text` could be the start of `stop`: its longest suffix
    that is a proper prefix of `stop`. A step tries at most STOP_TAIL_TRIES places where `stop`
    could start (stops may be long and repetitive: trying each would cost a step up to
    ~len(stop)^2 per stop); past them it holds back from the next place, more than needed but
    never less."""
    tail = text[max(0, len(text) - len(stop) + 1) :] if len(stop) > 1 else ""
    at = tail.find(stop[0])
    for _ in range(STOP_TAIL_TRIES):
        if at < 0:
            return 0
        if stop.startswith(tail[at:]):
            return len(tail) - at
        at = tail.find(stop[0], at + 1)
    return len(tail) - at if at >= 0 else 0


def _rid_hit(have: str, want: str, exact: bool) -> bool:
    return bool(want) and (have == want if exact else have.startswith(want))


@dataclass(slots=True)
class WeightSwap:
    """A pending weights change: applied by the worker once no request runs (SGLang waits for
    in-flight requests too), then the tree is emptied and `weights_version` moves on."""

    model: LlamaModel | HFModel
    done: threading.Event
    paused: int = 0  # requests held in the queue while the swap waited


def _shared_prompt(a: list[int], b: list[int]) -> int:
    """Leading tokens two prompts could share: never the last (see _start)."""
    return max(0, min(common_prefix(a, b), min(len(a), len(b)) - 1))


@dataclass(slots=True)
class ServeStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class Scheduler:
    def __init__(
        self,
        model: LlamaModel | HFModel,
        manager: RadixCacheManager,
        tokenizer,
        *,
        eos_ids: set[int],
        max_running: int,
        chunk_size: int,
        sessions,
        deterministic: bool = False,
        decode_kernel: DecodeKernel | None = None,
    ) -> None:
        self.model, self.manager, self.tokenizer = model, manager, tokenizer
        # the exact fast path (quantized weights with the native kernel) gives a token the same
        # bits in any step, as the flag does: the engine treats both alike (logprob matching)
        self.deterministic = deterministic or model.exact(deterministic, decode_kernel)
        self.decode_kernel = decode_kernel
        #: what decode attention runs on (EngineConfig.attention_backend as resolved)
        self.attention_backend = "native_cpu" if decode_kernel is not None else "torch_native"
        self.eos_ids, self.max_running, self.chunk_size = eos_ids, max_running, chunk_size
        self.sessions = sessions
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.lock = threading.RLock()  # held by the loop for each step and by API readers
        self.inbox: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.closed = False
        self.stats = ServeStats()
        self._worker_lock = threading.Lock()  # guards closing, starting and retiring the worker thread
        self.thread: threading.Thread | None = None
        self.live: dict[int, Request] = {}  # submitted and not finished, by id(): what abort() looks at
        self._live_lock = threading.Lock()
        self.weights_version = 0  # bumped by each weights swap; a request only inserts under its own
        self.swap: WeightSwap | None = None
        self.meters = ServeMeters()
        self.prefills = PrefillMemo()  # logprob prefills their twins adopt (runtime/engine/logprobs.py)
        self.aborted = 0  # requests finished by abort() or a client leaving
        self._retiring: threading.Thread | None = None  # a retired worker may still be unwinding
        # A weak reference: the hook must not keep a dropped engine (weights, pool) alive.
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- called from client threads ---------------------------------------------------
    def submit(self, req: Request) -> None:
        """Never takes the step lock: a client arriving mid-forward must not wait for (or be
        starved by) the loop, which re-takes that lock between steps."""
        with self._worker_lock:
            if self.closed:  # checked with the put: the closing worker drains the inbox under this lock
                raise EngineClosed("the engine was shut down")
            with self._live_lock:
                self.live[id(req)] = req
            self.inbox.put(req)
            self._start_worker()
        self.wake.set()

    def _start_worker(self) -> None:
        """Under `_worker_lock`."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="radixagent-scheduler", daemon=True)
            self.thread.start()

    def wake_worker(self) -> None:
        """A live worker (started if it retired) sees its next step now; none once closed."""
        with self._worker_lock:
            if not self.closed:
                self._start_worker()
        self.wake.set()

    def _retire_if_idle(self) -> bool:
        """Called by the worker after IDLE_EXIT_S without a wake-up. A submit racing with this either
        lands in the inbox before the check (the worker stays) or finds no thread and starts one."""
        with self._worker_lock:
            if self.closed or not self.inbox.empty() or self.waiting or self.running or self.swap:
                return False
            if self.manager.next_prefetch_in() is not None:
                return False  # a prefetch is scheduled: stay to run it
            self._retiring, self.thread = self.thread, None
            return True

    @property
    def queued(self) -> int:
        return len(self.waiting) + self.inbox.qsize()

    def close(self) -> None:
        """Fail what is queued or running (after the step in progress) and join the worker."""
        with self._worker_lock:
            self.closed = True
            if self.thread is None and not self.inbox.empty():
                self._fail_queued()
            threads = [t for t in (self.thread, self._retiring) if t is not None]
        self.wake.set()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=CLOSE_JOIN_S)
            if thread.is_alive():
                log.warning("scheduler worker still running %.0f s after close", CLOSE_JOIN_S)

    def _fail_queued(self) -> None:
        """No worker: fail the inbox here (a thread started at interpreter exit may be refused)."""
        with self.lock:
            self._drain_inbox()
            self._fail_all(EngineClosed("the engine was shut down"))

    def abort(
        self, rid: str, abort_all: bool = False, exact: bool = False, namespace: str | None = None
    ) -> int:
        """Mark requests aborted: every live one with `abort_all`, else those whose rid starts with
        `rid` (SGLang's match, so one call stops a batch's `rid_0`, `rid_1`, ...). The loop releases
        them at its next step boundary. Returns how many were marked. `exact`: only the request
        whose rid is `rid` (internal aborts: a client leaving must never stop `rid`-prefixed ones).
        `namespace`: only requests in that cache namespace (a tenant's abort)."""
        with self._live_lock:
            hits = [
                r
                for r in self.live.values()
                if (abort_all or _rid_hit(r.rid, rid, exact)) and namespace in (None, r.namespace)
            ]
        for req in hits:
            req.aborted = True
        if hits:
            self.wake_worker()
        return len(hits)

    def swap_weights(self, model: LlamaModel | HFModel, timeout_s: float | None = None) -> WeightSwap:
        """Hand new weights to the worker and wait until it applied them (see `WeightSwap`)."""
        with self.lock:
            if self.swap is not None:
                raise RuntimeError("a weights update is already in progress")
            swap = self.swap = WeightSwap(model, threading.Event())
        self.wake_worker()
        if not swap.done.wait(timeout_s):
            with self.lock:
                if self.swap is swap:  # not applied yet: withdraw it
                    self.swap = None
                    raise TimeoutError("requests still running after the timeout; weights not changed")
        return swap

    def _apply_swap(self) -> None:
        """Worker side, under the lock: swap once nothing runs. New requests wait meanwhile."""
        swap = self.swap
        if swap is None or self.running:
            return
        self.model = swap.model
        self.weights_version += 1
        self.manager.reset()  # nothing is locked: no request runs
        self.prefills.clear()
        self.manager.weights_changed(swap.model)
        swap.paused = len(self.waiting)
        self.swap = None
        swap.done.set()

    # ---- the loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            if not self.wake.wait(self._idle_wait()) and self._retire_if_idle():
                return
            with self.lock:
                self.wake.clear()
                self._drain_inbox()
                if not self.closed:
                    self.manager.prefetch_due()  # session prefetches, on this thread like every torch op
                if self.closed:
                    with self._worker_lock:  # no submit can slip in after this drain
                        self._drain_inbox()
                        self._fail_all(EngineClosed("the engine was shut down"))
                    return
                if self.swap is not None:
                    self._reap_aborted()
                    self._apply_swap()
                if self.waiting or self.running:
                    self._guarded_step()
                if self.waiting or self.running or self.swap is not None or not self.inbox.empty():
                    self.wake.set()
            time.sleep(0)  # hand the lock to API threads (stats, flush, session events) between steps

    def _idle_wait(self) -> float:
        due = self.manager.next_prefetch_in()
        return IDLE_EXIT_S if due is None else min(IDLE_EXIT_S, due)

    def _drain_inbox(self) -> None:
        while not self.inbox.empty():
            req = self.inbox.get_nowait()
            if req.session_id is not None:
                self.sessions.on_request(req.session_id)
            self.waiting.append(req)

    def _guarded_step(self) -> None:
        try:
            self._step()
        except Exception as exc:  # a bug must not kill the engine: fail the batch, keep serving
            log.exception("scheduler step failed")
            for req in list(self.running):
                req.error = exc
                self._finish(req, FinishReason("abort", message=str(exc)))

    def _reap_aborted(self) -> None:
        for req in [r for r in self.running if r.aborted]:
            self._finish(req, FinishReason("abort"))
        for req in [r for r in self.waiting if r.aborted]:
            self.waiting.remove(req)
            self._finish(req, FinishReason("abort"))

    def _step(self) -> None:
        self._reap_aborted()
        self._admit()
        if not self.running:
            return
        segments, fed = self._build_batch()
        logits = self.model.forward(
            segments, self.deterministic, self.decode_kernel
        ).cpu()  # sampling, grammar masks and RNGs live on the CPU
        now = time.perf_counter()
        self.meters.tokens(sum(1 for r in fed if r.prefilled and r.params.max_new_tokens), now)
        # every row's greedy pick in one call: one argmax per request cost ~40 us each, torch's over
        # all rows ~27 us a row (16 requests: ~0.44 ms of a step), the native one a few us a row
        kernel = self.decode_kernel
        best = kernel.argmax(logits) if kernel is not None else logits.argmax(dim=-1).tolist()
        for row, req in enumerate(fed):
            if segments[row].prompt_logits is not None:
                self._record_prompt_logprobs(req, segments[row])
            if not req.prefilled:
                continue
            try:
                self._on_prefilled(req, logits[row])
                self._emit_token(req, logits[row], now, best[row])
            except Exception as exc:  # one request's sampler or grammar failing fails that request only
                log.exception("request %s failed", req.rid)
                req.error = exc
                self._finish(req, FinishReason("abort", message=str(exc)))

    @staticmethod
    def _record_prompt_logprobs(req: Request, seg: Segment) -> None:
        assert req.logprob is not None and req.kv is not None and seg.prompt_logits is not None
        first = req.kv.length - len(seg.ids) + seg.logits_from  # forward advanced kv.length
        req.logprob.record_prompt(seg.prompt_logits.cpu(), first, req.input_ids)

    def _match_limit(self, req: Request) -> int:
        """Prompt tokens the cache may serve: never the last (its logits are always computed as in a
        cold run), and for logprob requests what runtime/engine/logprobs.py allows."""
        limit = len(req.input_ids) - 1
        return limit if req.logprob is None else min(limit, req.logprob.match_limit(self.deterministic))

    def _footprint(self, req: Request) -> int:
        return len(req.input_ids) + req.params.max_new_tokens

    def _admit(self) -> None:
        if len(self.running) >= self.max_running or self.swap is not None:
            return  # before ordering: no tree walks on decode steps of a full batch
        started = len(self.running)
        self._admit_waiting()
        new = self.running[started:]
        if new:
            self.meters.prefill_batch(sum(r.cached_len for r in new), sum(len(r.input_ids) for r in new))

    def _admit_waiting(self) -> None:
        reserved = sum(self._footprint(r) for r in self.running)
        for req in self._admission_order():
            if len(self.running) >= self.max_running:
                return
            if req.aborted:
                self.waiting.remove(req)
                self._finish(req, FinishReason("abort"))
                continue
            if self.running and reserved + self._footprint(req) > self.manager.pool.size:
                return  # queue rather than over-commit: wait for running requests to finish
            if self._shares_pending_prefix(req):
                continue  # a running request is computing our prefix: start once it is published
            self.waiting.remove(req)
            self.running.append(req)  # from here on, a failure below is released like any finish
            try:
                twin = self._start(req)
                if twin is not None:
                    self._start_twin(req, twin)
            except PoolExhausted:
                if len(self.running) > 1:
                    # the footprint check above does not see tree nodes that running requests lock
                    # beside their own slots (identical prompts computed apart, e.g. logprob
                    # choices of n > 1): wait for them to finish instead of failing (was a 503)
                    self.running.remove(req)
                    self.waiting.appendleft(req)
                    return
                req.error = InvalidRequest(
                    f"a prompt of {len(req.input_ids)} tokens with max_new_tokens={req.params.max_new_tokens} "
                    f"does not fit the KV pool ({self.manager.pool.size} tokens) even alone"
                )
                self._finish(req, FinishReason("abort", message=str(req.error)))
                continue
            except Exception as exc:  # fail this request only; what it locked or took goes back
                log.exception("request %s failed to start", req.rid)
                req.error = exc
                self._finish(req, FinishReason("abort", message=str(exc)))
                continue
            reserved += self._footprint(req)

    def _admission_order(self) -> list[Request]:
        """Longest cached prefix first (SGLang's LPM), ties in arrival order: a request whose
        prefix is in the tree runs before that prefix can be evicted, and costs little to start."""
        waiting = list(self.waiting)
        if not 1 < len(waiting) <= LPM_MAX_QUEUE:
            return waiting
        return sorted(waiting, key=lambda r: -self.cached_prefix(r))  # sorted() is stable

    def cached_prefix(self, req: Request) -> int:
        """Prompt tokens the tree would serve `req` now (a peek: changes nothing). Never the last
        prompt token: its logits are always computed (see _start)."""
        return min(self.manager.peek(req.input_ids, req.namespace, req.prefix_cache), self._match_limit(req))

    def _shares_pending_prefix(self, req: Request) -> bool:
        """True when a still-prefilling request covers a long uncached prefix of `req` (forks,
        QA fan-out, the choices of n > 1): waiting for its publish computes that prefix once
        instead of n times. An identical prompt always waits, however short."""
        if not req.prefix_cache:
            return False
        for other in self.running:
            if other.prefilled or not other.prefix_cache or other.namespace != req.namespace:
                continue
            if self._twin_pending(req, other):
                return True
            gain = (
                min(_shared_prompt(req.input_ids, other.input_ids), self._match_limit(req)) - other.cached_len
            )
            if gain >= MIN_SHARED_PREFIX or (gain > 0 and req.input_ids == other.input_ids):
                return True
        return False

    def _twin_pending(self, req: Request, other: Request) -> bool:
        """`other` is computing the very prefill `req` can adopt (runtime/engine/logprobs.py)."""
        return (
            req.logprob is not None
            and other.logprob is not None
            and other.weights_version == self.weights_version
            and req.input_ids == other.input_ids
            and req.logprob.covered_by(other.logprob.spec)
        )

    def _start(self, req: Request) -> PrefillRecord | None:
        """Match the cached prefix, lock it, take slots for the rest of the prompt (one call).
        Returns the prefill a logprob twin adopts when it took its whole prompt from the tree."""
        req.weights_version = self.weights_version
        twin = self._twin_record(req)
        if twin is not None:
            lease = self._lease(req, req.input_ids)
            if self.manager.holds(twin.node) and lease.cached_len == len(req.input_ids):
                self._hold(req, lease)
                return twin
            # the tree holds another copy of the prompt now: compute it as a cold run would
            self.manager.release(lease, req.input_ids, 0, insert=False)
            self.prefills.forget(req.namespace, req.input_ids)
        self._hold(req, self._lease(req, req.input_ids[: self._match_limit(req)]))
        return None

    def _twin_record(self, req: Request) -> PrefillRecord | None:
        if req.logprob is None or not req.prefix_cache:
            return None
        twin = self.prefills.find(req.namespace, req.input_ids, req.logprob, self.weights_version)
        if twin is None or self.manager.peek(req.input_ids, req.namespace) < len(req.input_ids):
            return None
        return twin

    def _lease(self, req: Request, key: list[int]) -> Lease:
        return self.manager.start(
            key,
            len(req.input_ids),
            req.namespace,
            req.session_id,
            req.priority,
            prefix_cache=req.prefix_cache,
            grow=req.params.max_new_tokens,
        )

    def _hold(self, req: Request, lease: Lease) -> None:
        req.lease = lease
        req.cached_len = req.lease.cached_len
        req.evicted_len = req.lease.evicted_len
        req.tier_tokens = req.lease.tier_len
        req.storage_backend = self.manager.storage_backend

    def _build_batch(self) -> tuple[list[Segment], list[Request]]:
        budget, segments, fed = self.chunk_size, [], []
        decoding = [r for r in self.running if r.prefilled]
        prefilling = [r for r in self.running if not r.prefilled]
        for req in decoding:
            assert req.lease is not None and req.kv is not None  # running: it holds a lease
            self.manager.extend(req.lease, 1)
            segments.append(Segment(req.kv, req.next_chunk(1)))
            fed.append(req)
            budget -= 1
        for req in prefilling:
            if budget <= 0 and segments:
                break
            chunk = req.next_chunk(max(budget, 1))
            assert req.kv is not None
            keep = req.logprob.logits_from(req.kv.length, len(chunk)) if req.logprob is not None else -1
            segments.append(Segment(req.kv, chunk, keep))
            fed.append(req)
            budget -= len(chunk)
        return segments, fed

    def _start_twin(self, req: Request, twin: PrefillRecord) -> None:
        """A twin's prompt is all in the tree: adopt the rest and draw its first token now."""
        assert req.logprob is not None
        req.twin = True
        req.logprob.adopt(twin)
        self._emit_token(req, twin.logits, time.perf_counter())

    def _on_prefilled(self, req: Request, logits: torch.Tensor) -> None:
        """First time the prompt is complete: publish it to the tree so later requests share it
        (and a logprob request's last logits, which the tree cannot give back, to its twins)."""
        if req.output_ids or not self._may_insert(req):
            return
        lease = req.lease
        assert lease is not None
        own = self.manager.publish(lease, req.input_ids, len(req.input_ids))
        if req.logprob is None or not own or lease.node is None:
            return  # not own: the tree kept an older copy of some positions, not the bits beside these logits
        self.prefills.remember(
            req.namespace,
            req.input_ids,
            PrefillRecord(
                logits.clone(),
                req.logprob.spec,
                tuple(req.logprob.input_vals),
                tuple(req.logprob.input_top),
                lease.node,
                req.weights_version,
            ),
        )

    def _may_insert(self, req: Request) -> bool:
        """KV goes into the tree only from a healthy request computed under the current weights
        (the manager adds: only from a lease that shares)."""
        return req.error is None and req.weights_version == self.weights_version

    def _emit_token(self, req: Request, logits: torch.Tensor, now: float, best: int | None = None) -> None:
        """`best`: the argmax of `logits`, where the step computed every row's at once."""
        if req.params.max_new_tokens == 0:
            req.first_token_time = now
            self._finish(req, FinishReason("length"))
            return
        mask = req.grammar.allowed_mask(logits.shape[-1]) if req.grammar is not None else None
        adjusted = req.sampler.adjust(logits)  # logit_bias, penalties, min_new_tokens
        token = req.sampler(adjusted, mask, best if adjusted is logits else None)
        req.sampler.observe(token, logits.shape[-1])
        if req.logprob is not None:
            req.logprob.record_output(req.sampler.logprobs(adjusted), token)
        if req.first_token_time is None:
            req.first_token_time = now
        req.output_ids.append(token)
        if req.grammar is not None:
            req.grammar.accept(token)
        reason = self._stop_reason(req, token)
        if reason is not None:
            self._finish(req, reason)
        elif len(req.output_ids) % req.params.stream_interval == 0:
            req.events.put(("token", req.result(now)))

    def _stop_reason(self, req: Request, token: int) -> FinishReason | None:
        p = req.params
        if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            req.text = self._detok(req.output_ids if p.no_stop_trim else req.output_ids[:-1], p)
            return FinishReason("stop", matched=token)
        before = len(req.text)
        text = req.running.update(req.output_ids, lambda ids: self._detok(ids, p))
        ending = _stop_hit(text, before, p) is not None or len(req.output_ids) >= p.max_new_tokens
        if not ending and (req.grammar is None or not req.grammar.is_finished()):
            req.text = _streamable(text, p)
            return None
        # the finished text is one whole decode (the running one equals it where the decoder
        # splits cleanly: runtime/engine/running_text.py)
        return self._finished(req, self._detok(req.output_ids, p), before)

    @staticmethod
    def _finished(req: Request, text: str, before: int) -> FinishReason | None:
        p = req.params
        hit = _stop_hit(text, before, p)
        if hit is not None:
            cut, stop = hit
            req.text = text[: cut + len(stop) if p.no_stop_trim else cut]
            return FinishReason("stop", matched=stop)
        req.text = text
        if req.grammar is not None and req.grammar.is_finished():
            return FinishReason("stop")
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishReason("length", length=len(req.output_ids))
        req.text = _streamable(text, p)  # a stop the running text showed and the whole decode has not
        return None

    def _detok(self, ids: Sequence[int], params: SamplingParams) -> str:
        # only a non-default value is passed: minimal tokenizers' decode takes no such keyword
        extra = {} if params.spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        return self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens, **extra)

    def _finish(self, req: Request, reason: FinishReason) -> None:
        req.finish_reason = reason
        with self._live_lock:
            self.live.pop(id(req), None)
        if req.aborted and req.error is None:
            self.aborted += 1
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        if req.session_id is not None:
            self.sessions.on_request_done(req.session_id)
        if reason.type != "abort":
            self.stats.requests += 1
            self.stats.prompt_tokens += len(req.input_ids)
            self.stats.cached_tokens += req.cached_len
            self.stats.completion_tokens += len(req.output_ids)
        req.events.put(("done", req.result(time.perf_counter())))
        req.done.set()

    def _release(self, req: Request) -> None:
        """Give the computed KV to the tree (or back to the pool) and drop the lock.
        An aborted request's computed KV is as valid as a finished one's: SGLang inserts it too."""
        if req.lease is None:
            return  # failed before its lease was granted
        computed = req.kv.length if req.kv is not None else 0
        self.manager.release(req.lease, req.input_ids + req.output_ids, computed, self._may_insert(req))
        req.lease = None

    def _fail_all(self, exc: BaseException) -> None:
        for req in list(self.running) + list(self.waiting):
            req.error = exc
            self._finish(req, FinishReason("abort", message=str(exc)))
        self.waiting.clear()


def _close_at_exit(ref: weakref.ReferenceType[Scheduler]) -> None:
    """atexit hook (see the module docstring): runs before the interpreter finalizes."""
    scheduler = ref()
    if scheduler is not None and not scheduler.closed:
        scheduler.close()
