"""The engine's step loop: admit waiting requests against the KV pool, run one forward over
every running request (decode tokens plus prefill chunks), sample, and release finished ones.

Only the worker thread touches the tree, the pool and running requests, always under
`self.lock`; other threads enqueue requests and read events. The worker exits after
`IDLE_EXIT_S` without work and the next submit starts a new one (see runtime/threads.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from runtime.cache.kv_pool import KVPool
from runtime.cache.radix import RadixCache
from runtime.model import LlamaModel, Segment, SpareBuffers
from runtime.request import Request

log = logging.getLogger("radixagent.scheduler")


#: shared uncached tokens worth waiting for instead of computing them twice
MIN_SHARED_PREFIX = 32
#: longest-prefix-first ordering sorts at most this many waiting requests (beyond: arrival order),
#: as SGLang's LPM policy does: a tree walk per waiting request per step must stay cheap
LPM_MAX_QUEUE = 128
#: an idle worker thread exits (freeing its OpenMP pool) after this long; restarting costs ~0.2 ms
IDLE_EXIT_S = 1.0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b)) - 1  # the last prompt token is never shared (see _start)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(slots=True)
class ServeStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class Scheduler:
    def __init__(self, model: LlamaModel, pool: KVPool, cache: RadixCache, tokenizer, eos_ids: set[int],
                 max_running: int, chunk_size: int, cache_enabled: bool, sessions) -> None:
        self.model, self.pool, self.cache, self.tokenizer = model, pool, cache, tokenizer
        self.eos_ids, self.max_running, self.chunk_size = eos_ids, max_running, chunk_size
        self.cache_enabled = cache_enabled
        self.sessions = sessions
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.lock = threading.RLock()  # held by the loop for each step and by API readers
        self.inbox: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.closed = False
        self.stats = ServeStats()
        # parked request buffers: at most half the pool's own size, and 1 GiB
        self.buffers = SpareBuffers(model.cfg, pool.fmt, model.device, min(pool.capacity_bytes // 2, 2**30))
        self._worker_lock = threading.Lock()  # guards starting and retiring the worker thread
        self.thread: threading.Thread | None = None

    # ---- called from client threads ---------------------------------------------------
    def submit(self, req: Request) -> None:
        """Never takes the step lock: a client arriving mid-forward must not wait for (or be
        starved by) the loop, which re-takes that lock between steps."""
        self.inbox.put(req)
        self._ensure_worker()
        self.wake.set()

    def _ensure_worker(self) -> None:
        with self._worker_lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="radixagent-scheduler", daemon=True)
                self.thread.start()

    def _retire_if_idle(self) -> bool:
        """Called by the worker after IDLE_EXIT_S without a wake-up. A submit racing with this either
        lands in the inbox before the check (the worker stays) or finds no thread and starts one."""
        with self._worker_lock:
            if self.closed or not self.inbox.empty() or self.waiting or self.running:
                return False
            self.thread = None
            return True

    @property
    def queued(self) -> int:
        return len(self.waiting) + self.inbox.qsize()

    def close(self) -> None:
        self.closed = True
        self._ensure_worker()  # the worker fails whatever is still queued, then exits
        self.wake.set()
        thread = self.thread
        if thread is not None:
            thread.join(timeout=30)

    def in_flight_slots(self) -> list[int]:
        """Slots owned by running requests and not yet by the tree (integrity checks)."""
        return [s for r in self.running for s in r.slots[r.tree_len :]]

    # ---- the loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            if not self.wake.wait(IDLE_EXIT_S) and self._retire_if_idle():
                return
            with self.lock:
                self.wake.clear()
                self._drain_inbox()
                if self.closed:
                    self._fail_all(RuntimeError("engine shut down"))
                    return
                if self.waiting or self.running:
                    self._guarded_step()
                if self.waiting or self.running or not self.inbox.empty():
                    self.wake.set()
            time.sleep(0)  # hand the lock to API threads (stats, flush, session events) between steps

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
                self._finish(req, {"type": "abort", "message": str(exc)})

    def _step(self) -> None:
        for req in [r for r in self.running if r.aborted]:
            self._finish(req, {"type": "abort"})
        self._admit()
        if not self.running:
            return
        segments, fed = self._build_batch()
        logits = self.model.forward(segments).cpu()  # sampling, grammar masks and RNGs live on the CPU
        now = time.perf_counter()
        for row, req in enumerate(fed):
            if not req.prefilled:
                continue
            try:
                self._on_prefilled(req)
                self._emit_token(req, logits[row], now)
            except Exception as exc:  # one request's sampler or grammar failing fails that request only
                log.exception("request %s failed", req.rid)
                req.error = exc
                self._finish(req, {"type": "abort", "message": str(exc)})

    def _footprint(self, req: Request) -> int:
        return len(req.input_ids) + req.params.max_new_tokens

    def _admit(self) -> None:
        if len(self.running) >= self.max_running:
            return  # before ordering: no tree walks on decode steps of a full batch
        reserved = sum(self._footprint(r) for r in self.running)
        for req in self._admission_order():
            if len(self.running) >= self.max_running:
                return
            if req.aborted:
                self.waiting.remove(req)
                self._finish(req, {"type": "abort"})
                continue
            if self.running and reserved + self._footprint(req) > self.pool.size:
                return  # queue rather than over-commit: wait for running requests to finish
            if self._shares_pending_prefix(req):
                continue  # a running request is computing our prefix: start once it is published
            self.waiting.remove(req)
            self.running.append(req)  # from here on, a failure below is released like any finish
            try:
                self._start(req)
            except Exception as exc:  # fail this request only; what it locked or took goes back
                log.exception("request %s failed to start", req.rid)
                req.error = exc
                self._finish(req, {"type": "abort", "message": str(exc)})
                continue
            reserved += self._footprint(req)

    def _admission_order(self) -> list[Request]:
        """Longest cached prefix first (SGLang's LPM), ties in arrival order: a request whose
        prefix is in the tree runs before that prefix can be evicted, and costs little to start."""
        waiting = list(self.waiting)
        if not self.cache_enabled or not 1 < len(waiting) <= LPM_MAX_QUEUE:
            return waiting
        return sorted(waiting, key=lambda r: -self.cached_prefix(r))  # sorted() is stable

    def cached_prefix(self, req: Request) -> int:
        """Prompt tokens the tree would serve `req` now (a peek: changes nothing). Never the last
        prompt token: its logits are always computed (see _start)."""
        if not (self.cache_enabled and req.use_cache):
            return 0
        return min(self.cache.cached_length(req.input_ids, req.namespace), len(req.input_ids) - 1)

    def _shares_pending_prefix(self, req: Request) -> bool:
        """True when a still-prefilling request covers a long uncached prefix of `req` (forks,
        QA fan-out): waiting for its publish computes that prefix once instead of n times."""
        if not (self.cache_enabled and req.use_cache):
            return False
        for other in self.running:
            if other.prefilled or not other.use_cache or other.namespace != req.namespace:
                continue
            if _common_prefix(req.input_ids, other.input_ids) >= other.cached_len + MIN_SHARED_PREFIX:
                return True
        return False

    def _start(self, req: Request) -> None:
        """Match the cached prefix, lock it, copy its KV into the request's buffer."""
        if self.cache_enabled and req.use_cache:
            # Never match the last prompt token: its logits must be computed as in a cold run.
            match = self.cache.match_prefix(req.input_ids[:-1], req.namespace, req.session_id)
            req.cached_len = req.tree_len = match.length
            req.last_node = match.node
            self.cache.lock(match.node)
            req.slots = list(match.slots)
        capacity = len(req.input_ids) + req.params.max_new_tokens
        req.kv = self.buffers.take(capacity)
        if req.cached_len:
            self.pool.read(req.slots, req.kv.span(0, req.cached_len))
            req.kv.length = req.cached_len
        req.slots += self._alloc(len(req.input_ids) - req.cached_len)

    def _alloc(self, n: int) -> list[int]:
        if n > self.pool.available:
            self.cache.evict(n - self.pool.available)
        return self.pool.alloc(n)

    def _build_batch(self) -> tuple[list[Segment], list[Request]]:
        budget, segments, fed = self.chunk_size, [], []
        decoding = [r for r in self.running if r.prefilled]
        prefilling = [r for r in self.running if not r.prefilled]
        for req in decoding:
            req.slots += self._alloc(1)
            segments.append(Segment(req.kv, req.next_chunk(1)))
            fed.append(req)
            budget -= 1
        for req in prefilling:
            if budget <= 0 and segments:
                break
            chunk = req.next_chunk(max(budget, 1))
            segments.append(Segment(req.kv, chunk))
            fed.append(req)
            budget -= len(chunk)
        return segments, fed

    def _on_prefilled(self, req: Request) -> None:
        """First time the prompt is complete: publish it to the tree so later requests share it."""
        if req.output_ids or not (self.cache_enabled and req.use_cache):
            return
        self._publish(req, len(req.input_ids))

    def _publish(self, req: Request, upto: int) -> None:
        """Insert the first `upto` positions into the tree and move the lock to the new path end."""
        assert req.kv is not None and req.last_node is not None
        key = (req.input_ids + req.output_ids)[:upto]
        present = self.cache.insert(key, req.slots[:upto], req.namespace, req.priority, req.session_id)
        adopted = req.slots[present:upto]
        if adopted:
            self.pool.write(adopted, req.kv.span(present, upto))
        self.pool.free(req.slots[req.tree_len : present])  # computed twice: keep the tree's copy
        match = self.cache.find_node(key, req.namespace)
        assert match.length == upto, "tree lost a just-inserted path"
        self.cache.lock(match.node)
        self.cache.unlock(req.last_node)
        req.last_node, req.slots, req.tree_len = match.node, match.slots + req.slots[upto:], upto

    def _emit_token(self, req: Request, logits: torch.Tensor, now: float) -> None:
        if req.params.max_new_tokens == 0:
            req.first_token_time = now
            self._finish(req, {"type": "length", "length": 0})
            return
        mask = req.grammar.allowed_mask(logits.shape[-1]) if req.grammar is not None else None
        token = req.sampler(logits, mask)
        if req.first_token_time is None:
            req.first_token_time = now
        req.output_ids.append(token)
        if req.grammar is not None:
            req.grammar.accept(token)
        reason = self._stop_reason(req, token)
        if reason is not None:
            self._finish(req, reason)
        else:
            req.events.put(("token", req.result(now)))

    def _stop_reason(self, req: Request, token: int) -> dict | None:
        p = req.params
        if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            req.text = self._detok(req.output_ids[:-1])
            return {"type": "stop", "matched": token}
        req.text = self._detok(req.output_ids)
        for s in p.stop:
            cut = req.text.find(s)
            if cut >= 0:
                req.text = req.text[:cut]
                return {"type": "stop", "matched": s}
        if req.grammar is not None and req.grammar.is_finished():
            return {"type": "stop", "matched": None}
        if len(req.output_ids) >= p.max_new_tokens:
            return {"type": "length", "length": len(req.output_ids)}
        return None

    def _detok(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _finish(self, req: Request, reason: dict) -> None:
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        if req.session_id is not None:
            self.sessions.on_request_done(req.session_id)
        if reason.get("type") != "abort":
            self.stats.requests += 1
            self.stats.prompt_tokens += len(req.input_ids)
            self.stats.cached_tokens += req.cached_len
            self.stats.completion_tokens += len(req.output_ids)
        req.events.put(("done", req.result(time.perf_counter())))
        req.done.set()

    def _release(self, req: Request) -> None:
        """Give the computed KV to the tree (or back to the pool) and drop the lock."""
        computed = req.kv.length if req.kv is not None else 0
        cached = self.cache_enabled and req.use_cache and req.finish_reason.get("type") != "abort"
        if cached and req.last_node is not None and computed > 0:
            self._publish(req, computed)
        self.pool.free(req.slots[req.tree_len :])
        if req.last_node is not None:
            self.cache.unlock(req.last_node)
        if req.kv is not None:
            self.buffers.give(req.kv)
        req.slots, req.kv, req.last_node = [], None, None

    def _fail_all(self, exc: BaseException) -> None:
        for req in list(self.running) + list(self.waiting):
            req.error = exc
            self._finish(req, {"type": "abort", "message": str(exc)})
        self.waiting.clear()
