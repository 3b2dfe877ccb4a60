"""Agent: configuration + entry points (`run`, `arun`, `fork`, `start`) over any Backend."""

from __future__ import annotations

import asyncio
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from agent.accounting import break_units
from agent.checkpoints import ForkResult, RunResult
from agent.choice import check_tool_choice
from agent.config import AgentConfig
from agent.examples import Example, check_examples, default_examples
from agent.layout import Document, Prompt, PromptLayout
from agent.run import Run, RunContext, Verify
from agent.tools import Tool
from agent.trace import SessionLedger, StepRecord, TraceWriter
from runtime.backends.base import Backend, Completion
from runtime.errors import RadixAgentError

DEFAULT_SYSTEM = "You are a careful assistant. Use the tools when they help, then answer briefly."


def _is_engine(obj: object) -> bool:
    # an Engine exists only once its module is imported: no import (and no torch) needed to tell
    module = sys.modules.get("runtime.engine.engine")
    return module is not None and isinstance(obj, module.Engine)


def _connect(target: object) -> Backend:
    """What `runtime.connect` makes of `target` ("embedded", an Engine, a URL, "openai:<url>")."""
    from runtime.backends import connect

    return connect(target)


class Agent:
    """A tool-using agent whose prompts only ever grow (so the prefix cache always hits).

    Thread-safe for concurrent `run`s; each run gets its own log. Runs sharing `session_id`
    share one ledger, so `ideal_cached_tokens` counts hits across those runs too.
    """

    def __init__(
        self,
        backend: Backend | object | None = None,
        system: str | Callable[[], str] = DEFAULT_SYSTEM,
        tools: Sequence[Tool] = (),
        documents: Sequence[Document] = (),
        max_steps: int = 12,
        reflect: bool | int = True,
        verify: Verify | None = None,
        session_id: str | None = None,
        cache_salt: str | None = None,
        trace_path: str | Path | None = None,
        sampling: dict[str, object] | None = None,
        *,
        max_backtracks: int = 2,
        max_errors: int = 3,
        dead_end: bool = True,
        priority: int | None = None,
        token_prompts: bool | None = None,
        tool_choice: str = "auto",
        examples: Sequence[Example] | None = None,
        ground_numbers: bool = True,
        reasoning_history: str = "preserve",
    ) -> None:
        sampling = {"temperature": 0.0, "max_new_tokens": 256, **(sampling or {})}
        self.config = AgentConfig(
            max_steps=max_steps,
            reflect=reflect,
            max_backtracks=max_backtracks,
            max_errors=max_errors,
            dead_end=dead_end,
            sampling=sampling,
            tool_choice=tool_choice,
            ground_numbers=ground_numbers,
            reasoning_history=reasoning_history,
        )
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names in {names}")
        check_tool_choice(tool_choice, names)
        self.tools = {t.name: t for t in tools}
        # The agent's own examples first, then each tool's (by tool name): a fixed order, a stable head.
        own = (*(examples or ()), *(e for t in sorted(tools, key=lambda t: t.name) for e in t.examples))
        check_examples(own, names)
        # None (the default) and no tool examples: the built-in protocol demonstrations; () opts out.
        self.examples = own if own or examples is not None else default_examples(names)
        self.system, self.documents, self.verify = system, tuple(documents), verify
        self.session_id, self.cache_salt, self.priority = session_id, cache_salt, priority
        self.trace_path = Path(trace_path) if trace_path is not None else None
        # a backend (a Backend, or an object with its generate/tokenize methods), or what
        # runtime.connect takes (an Engine, a URL), connected lazily: building an Agent never loads a model
        connects = backend is None or isinstance(backend, str) or _is_engine(backend)
        self._backend: Backend | None = None if connects else cast(Backend, backend)
        self._target = "embedded" if backend is None else backend
        self._token_prompts = token_prompts
        self._lock = threading.Lock()
        self._writer: TraceWriter | None = None
        self._ledgers: dict[str, tuple[SessionLedger, SessionLedger]] = {}
        self._tokenize: Callable[[str], list[int]] | None = None
        self._probed = False

    # -- wiring ---------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = _connect(self._target)
            return self._backend

    def _probe(self) -> None:
        """The backend declares whether it tokenizes: then ideal hits are in tokens (and prompts
        too, if it takes ids). Asked once, lazily: building an Agent never loads a model."""
        backend = self.backend
        with self._lock:
            if self._probed:
                return
            self._tokenize = backend.tokenize if backend.can_tokenize else None
            self._probed = True

    def _token_mode(self) -> bool:
        self._probe()
        wanted = self.backend.supports_input_ids if self._token_prompts is None else self._token_prompts
        return bool(wanted and self._tokenize is not None)

    def _context(self, session_id: str) -> RunContext:
        token_mode = self._token_mode()
        with self._lock:
            if session_id not in self._ledgers:
                render = self._decode_or_none()
                breaks = SessionLedger(render)
                ideal = breaks if token_mode or self._tokenize is None else SessionLedger(render)
                self._ledgers[session_id] = (breaks, ideal)
            breaks, ideal = self._ledgers[session_id]
            if self.trace_path is not None and self._writer is None:
                self._writer = TraceWriter(self.trace_path)
        return RunContext(
            backend=self.backend,
            config=self.config,
            tools=self.tools,
            verify=self.verify,
            session_id=session_id,
            run_id=uuid.uuid4().hex[:12],
            breaks=breaks,
            ideal=ideal,
            tokenize=self._tokenize,
            writer=self._writer,
            cache_salt=self.cache_salt,
            priority=self.priority,
        )

    def _decode_or_none(self) -> Callable[[list[int]], str] | None:
        return self._backend.decode if self._backend is not None else None

    def _layout(self, token_mode: bool) -> PromptLayout:
        return PromptLayout(
            self.system,
            list(self.tools.values()),
            self.documents,
            tokenize=self._tokenize if token_mode else None,
            dead_end=self.config.dead_end,
            examples=self.examples,
            reasoning_history=self.config.reasoning_history,
        )

    def _new_session(self) -> str:
        # The id never enters a prompt, so a random one cannot hurt the cache.
        return self.session_id or f"s-{uuid.uuid4().hex[:12]}"

    # -- entry points ---------------------------------------------------------------------------

    def start(self, task: str, session_id: str | None = None, tool_choice: str | None = None) -> Run:
        """A Run positioned before its first model call, for custom policies (drive `run.step()`).

        `tool_choice` overrides the agent's for this run. The caller owns the session: call
        `run.close()` when done (run() does this).
        """
        if tool_choice is not None:
            check_tool_choice(tool_choice, list(self.tools))
        ctx = self._context(session_id or self._new_session())
        ctx.breaks.expect(0, ())  # a new run is a new branch of the session: nothing to extend yet
        ctx.event("open", run_id=ctx.run_id)
        return Run(ctx, self._layout(self._token_mode()), task, branch=0, tool_choice=tool_choice)

    def run(self, task: str, tool_choice: str | None = None) -> RunResult:
        """Run `task` to its end. `tool_choice` ("auto" | "required" | "none" | a tool name)
        overrides the agent's for this run."""
        run = self.start(task, tool_choice=tool_choice)
        try:
            return run.run_to_end()
        finally:
            run.close()

    async def arun(self, task: str, tool_choice: str | None = None) -> RunResult:
        """Async form: the loop runs in a worker thread (backends and tools may block)."""
        return await asyncio.to_thread(self.run, task, tool_choice)

    def fork(self, n: int, task: str, temperature: float | None = None) -> ForkResult:
        """Run `n` branches from one shared prefix, prefilled once before they start.

        Branch b (1..n) samples with seed b and `temperature` (default: the agent's temperature,
        or `fork_temperature` when that is greedy). The prefill is branch 0's "fork" record.
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        ctx = self._context(self._new_session())
        ctx.event("open", run_id=ctx.run_id, branches=n)
        try:
            base = Run(ctx, self._layout(self._token_mode()), task, branch=0)
            prefill = self._prefill(base)
            shared = base.layout.render()
            runs = [self._branch(ctx, base, shared, b, temperature) for b in range(1, n + 1)]
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="fork") as pool:
                results = list(pool.map(Run.run_to_end, runs))
        finally:
            ctx.event("close", run_id=ctx.run_id)
        return ForkResult(results, prefill)

    def _branch(
        self, ctx: RunContext, base: Run, shared: Prompt, branch: int, temperature: float | None
    ) -> Run:
        sampling = dict(self.config.sampling)
        base_temp = float(cast(float, sampling.get("temperature", 0.0)))  # a number in SGLang's shape
        sampling["temperature"] = temperature or (
            base_temp if base_temp > 0 else self.config.fork_temperature
        )
        sampling["seed"] = branch
        ctx.breaks.expect(branch, break_units(shared))
        run = Run(
            ctx, base.layout.clone(), None, branch=branch, sampling=sampling, tool_choice=base.tool_choice
        )
        run.task = base.task  # already in the shared log; kept for tool_choice "auto"
        return run

    def _prefill(self, base: Run) -> StepRecord | None:
        """Compute the shared prefix's KV once (max_new_tokens=0; 1 where a server needs >= 1)."""
        prompt = base.layout.render()
        completion: Completion | None = None
        for max_new in (0, 1):
            params = {**base.sampling, "max_new_tokens": max_new}
            try:
                completion = base.generate(prompt, params, rid=f"{base.ctx.run_id}-prefill")
                break
            except RadixAgentError:
                continue
        if completion is None:
            return None  # branches still run; they just share nothing precomputed
        return base.record_prefill(prompt, completion)

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
