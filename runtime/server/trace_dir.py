"""`serve --trace-dir DIR`: the agent SDK's per-step trace (ideal hits, prefix breaks, `miss`)
for any client that names its session, with no code change on the client's side.

A request names its session with (first wins) `session_id` or `session_params.id` (SGLang),
OpenAI's `prompt_cache_key`, or an `X-Session-Id` header. Each named request's prompt and output
go through the same ledger as the SDK's (runtime/trace/ledger.py), one ledger per (salt, session),
and become one trace line, written and flushed at once, in `DIR/<salt digest>.jsonl` (`default`
without a salt): a tenant's trace never holds another's steps, and a file name never shows a
salt. A file past `max_bytes` is rotated (`.1` ... `.keep`, oldest dropped); at most
`max_sessions` ledgers are kept (least recently used dropped: its next step starts a new one).

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
from runtime.trace.ledger import Served, SessionLedger, StepAccounting, StepEvent
from runtime.trace.record import StepRecord, TraceWriter

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
    max_bytes: int = 16 * 2**20
    keep: int = 3
    max_sessions: int = 1024

    def __post_init__(self) -> None:
        if self.max_bytes < 4096 or self.keep < 1 or self.max_sessions < 1:
            raise ValueError("trace dir: max_bytes >= 4096, keep >= 1, max_sessions >= 1")


@dataclass(slots=True)
class _Session:
    accounting: StepAccounting
    steps: int = 0


class TraceDir:
    """Thread-safe: requests of many clients finish at once."""

    def __init__(
        self, config: TraceDirConfig, tokenize: Callable[[str], Sequence[int]], cache_off: bool = False
    ) -> None:
        self.config, self.tokenize, self.cache_off = config, tokenize, cache_off
        config.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()
        self._writers: dict[str, TraceWriter] = {}

    def observe(self, requests: Sequence[GenerationRequest], outputs: Sequence[dict[str, Any]]) -> None:
        """Account one finished engine call: each request with its output, in order."""
        for request, out in zip(requests, outputs, strict=True):
            session = request.session_id or TRACE_SESSION.get()
            if not session:
                continue
            try:
                self._observe_one(session, request, out)
            except Exception:  # the trace is a diagnosis: it never fails a request
                log.exception("trace-dir accounting failed")

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
            state = self._session(tenant, session)
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

    def _session(self, tenant: str, session: str) -> _Session:
        key = (tenant, session)
        state = self._sessions.get(key)
        if state is None:
            state = self._sessions[key] = _Session(StepAccounting(SessionLedger()))
            while len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(key)
        return state

    def _write(self, tenant: str, record: StepRecord) -> None:
        writer = self._writers.get(tenant)
        if writer is None:
            writer = self._writers[tenant] = TraceWriter(self.path(tenant))
        writer.write(record)
        if writer.size() >= self.config.max_bytes:
            writer.close()
            del self._writers[tenant]
            self._rotate(self.path(tenant))

    def _rotate(self, path: Path) -> None:
        for index in range(self.config.keep - 1, 0, -1):
            older = path.with_name(f"{path.name}.{index}")
            if older.exists():
                older.replace(path.with_name(f"{path.name}.{index + 1}"))
        path.replace(path.with_name(f"{path.name}.1"))

    def path(self, tenant: str) -> Path:
        return self.config.root / f"{tenant}.jsonl"

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()


def _str(value: Any) -> str | None:
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
    cache_off = bool(getattr(getattr(engine, "config", None), "disable_radix_cache", False))
    config = TraceDirConfig(Path(args.trace_dir), max_bytes=args.trace_max_bytes)
    return TracingBridge(engine, args.max_threads, TraceDir(config, engine.tokenize, cache_off))
