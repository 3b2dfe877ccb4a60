"""`RecordingBackend`: wraps any Backend, forces the prefix cache on or off, records every call.

The eval runs each suite twice through two of these (cached and uncached) and compares the
records call by call. Mutation: `generate` appends one `CallRecord` to `calls` (under a lock, so
concurrent agents are fine); `reset` clears them. Everything else delegates to the wrapped backend.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.accounting import served_from, worker_of
from runtime.backends.base import Backend, Completion, WrappedBackend
from runtime.trace.ledger import SessionLedger, StepAccounting, StepEvent


@dataclass(slots=True)
class CallRecord:
    """One model call as the eval sees it. `prompt_key` identifies the prompt (ids or text)."""

    index: int
    prompt_key: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    latency_s: float
    output_ids: list[int]
    text: str
    finish_reason: str
    session_id: str | None
    started_s: float  # seconds since the recorder was (re)set
    error: str | None = None
    #: uncached prompt tokens by cause (runtime/trace/ledger.py), for token-id prompts of a named session
    miss: dict[str, int] | None = None

    @property
    def output_key(self) -> tuple[int, ...] | str:
        """What "identical output" compares: token ids when the backend returns them, else text."""
        return tuple(self.output_ids) if self.output_ids else self.text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_key(prompt: str | None, input_ids: list[int] | None) -> str:
    """A short stable fingerprint of the prompt; ids and text never collide (different tags)."""
    raw = ("ids:" + ",".join(map(str, input_ids))) if input_ids is not None else "text:" + (prompt or "")
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


@dataclass(slots=True)
class _State:
    calls: list[CallRecord] = field(default_factory=list)
    flush_failures: int = 0
    origin: float = field(default_factory=time.perf_counter)


class RecordingBackend(WrappedBackend):
    """`inner` with `prefix_cache` forced on every call, each call recorded as a `CallRecord`.

    `flush_each=True` empties the server's cache before every request: the uncached baseline for
    servers that ignore `prefix_cache=False`. `on_call` (optional) sees each record as it lands.
    The wrapped backend is not owned: `close` leaves it open.
    """

    def __init__(
        self,
        inner: Backend,
        prefix_cache: bool,
        *,
        flush_each: bool = False,
        on_call: Callable[[CallRecord], None] | None = None,
    ) -> None:
        super().__init__(inner)
        self.prefix_cache, self.flush_each = prefix_cache, flush_each
        self.on_call = on_call
        self._lock = threading.Lock()
        self._state = _State()
        self._ledgers: dict[tuple[str, str | None], SessionLedger] = {}

    @property
    def calls(self) -> list[CallRecord]:
        with self._lock:
            return list(self._state.calls)

    @property
    def flush_failures(self) -> int:
        return self._state.flush_failures

    def reset(self) -> None:
        """Forget the recorded calls and restart the clock (between suites and repeats)."""
        with self._lock:
            self._state = _State()
            self._ledgers = {}

    def generate(
        self,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        sampling_params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
        prefix_cache: bool = True,
        rid: str | None = None,
    ) -> Completion:
        if self.flush_each and not self.inner.flush_cache():
            with self._lock:
                self._state.flush_failures += 1
        started = time.perf_counter()
        try:
            out = self.inner.generate(
                prompt,
                input_ids,
                sampling_params,
                session_id=session_id,
                cache_salt=cache_salt,
                priority=priority,
                prefix_cache=self.prefix_cache,
                rid=rid,
            )
        except Exception as exc:
            self._record_failure(prompt, input_ids, session_id, started, exc)
            raise
        miss = self._miss(input_ids, out, session_id, cache_salt)
        self._append(
            lambda index, origin: CallRecord(
                index=index,
                prompt_key=prompt_key(prompt, input_ids),
                prompt_tokens=out.prompt_tokens,
                cached_tokens=out.cached_tokens,
                completion_tokens=out.completion_tokens,
                ttft_s=out.ttft_s,
                latency_s=out.latency_s,
                output_ids=list(out.output_ids),
                text=out.text,
                finish_reason=out.finish_reason,
                session_id=session_id,
                started_s=started - origin,
                miss=miss,
            )
        )
        return out

    def _miss(
        self, input_ids: list[int] | None, out: Completion, session_id: str | None, salt: str | None
    ) -> dict[str, int] | None:
        """The call's miss causes through the shared ledger (one per session and salt). Calls of
        one session may run concurrently (forks), so none is held to extend another: a prompt
        change shows as `new` here; the agent's own trace names it."""
        if input_ids is None or session_id is None:
            return None
        with self._lock:
            ledger = self._ledgers.setdefault((session_id, salt), SessionLedger())
            branch = len(self._state.calls)
        ev = StepEvent(
            branch=branch,
            sent=input_ids,
            sent_output=out.output_ids,
            units=input_ids,
            outputs=out.output_ids,
            served=served_from(out),
            salt=salt,
            worker=worker_of(out),
        )
        return StepAccounting(ledger).observe(ev).miss

    def _record_failure(self, prompt, input_ids, session_id, started: float, exc: Exception) -> None:
        latency = time.perf_counter() - started
        self._append(
            lambda index, origin: CallRecord(
                index=index,
                prompt_key=prompt_key(prompt, input_ids),
                prompt_tokens=0,
                cached_tokens=0,
                completion_tokens=0,
                ttft_s=latency,
                latency_s=latency,
                output_ids=[],
                text="",
                finish_reason="error",
                session_id=session_id,
                started_s=started - origin,
                error=f"{type(exc).__name__}: {exc}",
            )
        )

    def _append(self, build: Callable[[int, float], CallRecord]) -> None:
        with self._lock:
            record = build(len(self._state.calls), self._state.origin)
            self._state.calls.append(record)
        if self.on_call is not None:
            self.on_call(record)

    def close(self) -> None:
        """No-op: the eval owns the wrapped backend and closes it itself."""
