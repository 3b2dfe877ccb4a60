"""`serve --trace-dir DIR`: the agent SDK's per-step trace (ideal hits, prefix breaks, `miss`)
for any client that names its session, with no code change on the client's side.

A request names its session with (first wins) `session_id` or `session_params.id` (SGLang),
OpenAI's `prompt_cache_key`, or an `X-Session-Id` header. Each named request's prompt and output
go through the same ledger as the SDK's (runtime/trace/ledger.py), one ledger per (salt, session),
and become one trace line, written and flushed at once, in `DIR/<salt digest>.jsonl` (`default`
without a salt): a tenant's trace never holds another's steps, and a file name never shows a
salt. Files, descriptors and disk are bounded by runtime/server/trace_files.py; ledgers by
`max_sessions`, `max_ledger_tokens` and `max_session_tokens` (least recently used dropped: its
next step starts a new one). Over a bound, trace lines are dropped (counted in /get_server_info's
`trace_dir`), never requests.

`TracingBridge` is the hook: it wraps the engine bridge that both the native and the OpenAI
routes call, so no route changes beyond naming the session.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.cache.namespace import namespace_key
from runtime.engine.generation import GenerationRequest
from runtime.server.bridge import Chunk, EngineBridge
from runtime.server.reasoning_history import TEMPLATE_REWRITES
from runtime.server.trace_files import FileBounds, TraceFiles
from runtime.trace.ledger import Served, SessionLedger, StepAccounting, StepEvent
from runtime.trace.record import StepRecord

if TYPE_CHECKING:
    from runtime.engine.engine import Engine
    from runtime.server.args import ServerArgs

log = logging.getLogger("radixagent.trace_dir")

#: the session a request names outside the engine's own fields (header, prompt_cache_key):
#: request-scoped, set by `SessionHeaderMiddleware` and the OpenAI routes
TRACE_SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_session", default=None)
HEADER = b"x-session-id"


@dataclass(frozen=True, slots=True)
class TraceDirConfig:
    root: Path
    files: FileBounds = FileBounds()
    max_sessions: int = 1024
    #: token ids all session ledgers may hold together (~250 bytes each); least recent dropped
    max_ledger_tokens: int = 2_000_000
    #: token ids one session's ledger may hold; past it the session's ledger starts afresh
    max_session_tokens: int = 262_144

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_session_tokens < 1:
            raise ValueError("trace dir: max_sessions >= 1, max_session_tokens >= 1")
        if self.max_ledger_tokens < self.max_session_tokens:
            raise ValueError("trace dir: max_ledger_tokens must be >= max_session_tokens")


@dataclass(slots=True)
class _Session:
    accounting: StepAccounting
    steps: int = 0
    tokens: int = 0  # token ids its ledger holds at most (each step's prompt + output)


class TraceDir:
    """Thread-safe: requests of many clients finish at once."""

    def __init__(
        self, config: TraceDirConfig, tokenize: Callable[[str], Sequence[int]], cache_off: bool = False
    ) -> None:
        self.config, self.tokenize, self.cache_off = config, tokenize, cache_off
        self.files = TraceFiles(config.root, config.files)
        self._lock = threading.Lock()
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()
        self._ledger_tokens = 0
        self._failures = 0

    def observe(self, requests: Sequence[GenerationRequest], outputs: Sequence[dict[str, Any]]) -> None:
        """Account one finished engine call: each request with its output, in order."""
        for request, out in zip(requests, outputs, strict=True):
            session = request.session_id or TRACE_SESSION.get()
            if not session:
                continue
            try:
                self._observe_one(session, request, out)
            except Exception:  # the trace is a diagnosis: it never fails a request
                self._failures += 1
                if self._failures in (1, 10, 100) or self._failures % 10_000 == 0:  # never a log flood
                    log.exception("trace-dir accounting failed (%d so far)", self._failures)

    def _observe_one(self, session: str, request: GenerationRequest, out: dict[str, Any]) -> None:
        meta = out.get("meta_info") or {}
        if not isinstance(meta.get("finish_reason"), dict) or meta["finish_reason"].get("type") == "abort":
            return  # an aborted or failed request served nothing worth accounting
        if request.input_ids is not None:
            ids = list(request.input_ids)
        else:
            assert request.prompt is not None  # a request holds exactly one of the two
            ids = list(self.tokenize(request.prompt))
        tenant = namespace_key(request.cache_salt) or "default"
        served = Served(
            prompt_tokens=int(meta.get("prompt_tokens", len(ids))),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            evicted_tokens=meta.get("evicted_prefix_tokens"),
            cache_off=self.cache_off or not request.prefix_cache or meta.get("prefix_cache") is False,
        )
        output = list(out.get("output_ids") or [])
        with self._lock:
            state = self._session(tenant, session, len(ids) + len(output))
            step, state.steps = state.steps, state.steps + 1
            ev = StepEvent(
                branch=0,
                sent=ids,
                sent_output=output,
                units=ids,
                outputs=output,
                served=served,
                completion_tokens=len(output),
                worker=_str(meta.get("worker_id")),
                rewrites=tuple(r.as_dict() for r in TEMPLATE_REWRITES.get()),
            )
            account = state.accounting.observe(ev)
            record = StepRecord(
                run_id=session,
                session_id=session,
                branch=0,
                step=step,
                kind="act",
                prompt_tokens=served.prompt_tokens,
                cached_tokens=served.cached_tokens,
                ideal_cached_tokens=account.ideal_cached_tokens,
                completion_tokens=len(output),
                ttft_s=float(meta.get("ttft") or 0.0),
                latency_s=float(meta.get("e2e_latency") or 0.0),
                finish_reason=str(meta["finish_reason"].get("type")),
                prefix_break=account.prefix_break,
                tool=None,
                miss=account.miss,
            )
            self._write(tenant, record)

    def _session(self, tenant: str, session: str, tokens: int) -> _Session:
        """The session's ledger with room for `tokens` more: a session past its own bound starts
        afresh; least recently used sessions go while all ledgers together exceed theirs."""
        key = (tenant, session)
        state = self._sessions.get(key)
        if state is not None and state.tokens + tokens > self.config.max_session_tokens:
            self._forget(key)
            state = None
        if state is None:
            state = self._sessions[key] = _Session(StepAccounting(SessionLedger()))
        self._sessions.move_to_end(key)
        state.tokens += tokens
        self._ledger_tokens += tokens
        while len(self._sessions) > 1 and (
            len(self._sessions) > self.config.max_sessions
            or self._ledger_tokens > self.config.max_ledger_tokens
        ):
            self._forget(next(iter(self._sessions)))
        return state

    def _forget(self, key: tuple[str, str]) -> None:
        state = self._sessions.pop(key)
        self._ledger_tokens -= state.tokens

    def _write(self, tenant: str, record: StepRecord) -> None:
        self.files.write(tenant, record.to_json())

    def path(self, tenant: str) -> Path:
        return self.files.path(tenant)

    def stats(self) -> dict[str, int]:
        """For /get_server_info: what the bounds hold now, and what was dropped."""
        with self._lock:
            return {
                **self.files.stats(),
                "sessions": len(self._sessions),
                "ledger_tokens": self._ledger_tokens,
                "accounting_failures": self._failures,
            }

    def close(self) -> None:
        with self._lock:
            self.files.close()


def _str(value: object) -> str | None:
    return None if value is None else str(value)


class TracingBridge(EngineBridge):
    """The engine bridge, with each finished request of a named session accounted in the trace."""

    def __init__(self, engine: Engine, max_threads: int, trace: TraceDir) -> None:
        super().__init__(engine, max_threads)
        self.trace = trace

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Chunk]:
        outs = await super().generate(requests)
        self.trace.observe(requests, outs)
        return outs

    async def open_stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        chunks = await super().open_stream(request)
        if not (request.session_id or TRACE_SESSION.get()):
            return chunks
        return self._traced(chunks, request, TRACE_SESSION.get())

    async def _traced(
        self, chunks: AsyncIterator[Chunk], request: GenerationRequest, session: str | None
    ) -> AsyncIterator[Chunk]:
        last: Chunk | None = None
        try:
            async for chunk in chunks:
                last = chunk
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        if last is not None:
            token = TRACE_SESSION.set(session)  # a stream's tail may run in another context
            try:
                self.trace.observe([request], [last])
            finally:
                TRACE_SESSION.reset(token)


class SessionHeaderMiddleware:
    """Names the request's trace session from its `X-Session-Id` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value = dict(scope.get("headers") or []).get(HEADER)
        token = TRACE_SESSION.set(value.decode("latin-1")[:256] if value else None)
        try:
            await self.app(scope, receive, send)
        finally:
            TRACE_SESSION.reset(token)


def tracing_bridge(engine: Engine, args: ServerArgs) -> TracingBridge:
    """The bridge `ServerState.build` installs for `--trace-dir`."""
    assert args.trace_dir is not None
    cache_off = engine.info().config.disable_radix_cache
    files = FileBounds(
        max_bytes=args.trace_max_bytes, max_total_bytes=max(args.trace_max_total_bytes, args.trace_max_bytes)
    )
    config = TraceDirConfig(Path(args.trace_dir), files)
    return TracingBridge(engine, args.max_threads, TraceDir(config, engine.tokenize, cache_off))
