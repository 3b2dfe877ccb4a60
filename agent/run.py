"""Run: one branch of an agent session, driven one model call at a time.

`step()` renders the prompt (head + append-only log), calls the backend under the action
schema, appends the model's turn verbatim, then acts: run a tool, accept/reject an answer,
reflect, or roll back to a checkpoint. Every call becomes a `StepRecord` in the trace.
Custom policies drive `step()` themselves and use `checkpoint()` / `rollback()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from agent import prompts
from agent.accounting import TraceObserver, break_units
from agent.actions import Action, action_schema, parse_action, thought_schema
from agent.checkpoints import Checkpoint, RunResult, RunStatus, Step
from agent.choice import allowed_actions
from agent.config import AgentConfig
from agent.constraints import context_numbers
from agent.errors import ParseError
from agent.layout import Piece, Prompt, PromptLayout
from agent.tools import Tool, ToolResult
from agent.trace import SessionLedger, StepRecord, TraceWriter
from runtime.backends.base import Backend, Completion, generate_by_keywords
from runtime.engine.generation import GenerationRequest
from runtime.errors import RadixAgentError
from runtime.trace.ledger import StepAccounting

log = logging.getLogger(__name__)

Verify = Callable[[str], object]


@dataclass(slots=True)
class RunContext:
    """What the branches of one run share: backend, session, ledgers, trace file."""

    backend: Backend
    config: AgentConfig
    tools: dict[str, Tool]
    verify: Verify | None
    session_id: str
    run_id: str
    breaks: SessionLedger  # on what is sent: token ids, or characters in text mode
    ideal: SessionLedger  # on token ids (characters when the backend cannot tokenize)
    tokenize: Callable[[str], list[int]] | None  # set when ideal units are token ids
    writer: TraceWriter | None
    cache_salt: str | None = None
    priority: int | None = None

    def event(self, kind: str, **info: object) -> None:
        """Session events are hints to the cache: a failure to deliver one never stops a run."""
        if self.cache_salt:  # sessions belong to their salt on the server: events must name it too
            info = {"cache_salt": self.cache_salt, **info}
        try:
            self.backend.session_event(self.session_id, kind, **info)  # type: ignore[arg-type]
        except RadixAgentError as exc:
            log.warning("session event %s for %s failed: %s", kind, self.session_id, exc)


def _verdict(verify: Verify, answer: str) -> tuple[bool, str]:
    try:
        verdict = verify(answer)
    except Exception as exc:  # a crashing verifier rejects; it does not crash the agent
        return False, f"verifier raised {type(exc).__name__}: {exc}"
    if isinstance(verdict, tuple):
        return bool(verdict[0]), str(verdict[1]) if len(verdict) > 1 else "rejected"
    return bool(verdict), "rejected by the verifier"


class Run:
    """One branch. Not thread-safe; fork gives each branch its own Run."""

    def __init__(
        self,
        ctx: RunContext,
        layout: PromptLayout,
        task: str | None,
        branch: int = 0,
        sampling: dict[str, object] | None = None,
        tool_choice: str | None = None,
    ) -> None:
        self.ctx, self.layout, self.branch = ctx, layout, branch
        #: this run's tool_choice (agent/choice.py); `task` lets "auto" see a tool the task names
        self.tool_choice = tool_choice or ctx.config.tool_choice
        self.task = task
        #: JSON schema of the answer string (None: any string); custom policies may narrow it
        self.answer_schema: dict[str, object] | None = None
        #: per tool name, an arguments schema replacing the tool's own (custom policies narrow
        #: what a call may say, e.g. an expression over the task's numbers); empty: the tools' own
        self.argument_schemas: dict[str, dict[str, object]] = {}
        self.sampling = dict(sampling if sampling is not None else ctx.config.sampling)
        self.steps: list[Step] = []
        #: the trace: an observer of this run's step events (agent/accounting.py)
        self.observer = TraceObserver(
            StepAccounting(ctx.breaks, ctx.ideal),
            ctx.tokenize,
            ctx.writer,
            (ctx.run_id, ctx.session_id, branch),
            ctx.cache_salt,
        )
        self.status: RunStatus = "running"
        self.answer: str | None = None
        self.verified: bool | None = None
        self._errors = 0
        self._backtracks = 0
        self._next: str | None = None  # "reflect" | "backtrack": the kind of the next call
        if task is not None:
            layout.add_message("user", prompts.TASK.format(task=task))
        self.checkpoints: list[Checkpoint] = [self.checkpoint()]

    @property
    def trace(self) -> list[StepRecord]:
        return self.observer.trace

    @property
    def done(self) -> bool:
        return self.status != "running"

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        """The current end of the log; later prompts may roll back to extend exactly this."""
        head = self.layout.render(generation_prompt=False)
        return Checkpoint(self.layout.mark(), len(self.steps), break_units(head))

    def rollback(self, checkpoint: Checkpoint, note: str | None = None) -> None:
        """Drop the log after `checkpoint` (a declared rollback), optionally append `note`.

        The abandoned branch is reported to the backend so its cache can evict it first.
        """
        abandoned = list(self.observer.last_full)
        self.layout.truncate(checkpoint.mark)
        for step in self.steps[checkpoint.step :]:
            step.abandoned = True
        self.ctx.breaks.expect(self.branch, checkpoint.units)
        self.ctx.event("abandon", **self._abandon_info(abandoned, checkpoint))
        if note:
            self.layout.add_message("user", note)
        self._backtracks += 1
        self._errors = 0
        self._next = "backtrack"

    def _abandon_info(self, abandoned: list[Hashable], checkpoint: Checkpoint) -> dict[str, object]:
        """`input_ids` of the abandoned context and `keep`: how many leading tokens stay live."""
        info: dict[str, object] = {"branch": self.branch}
        if self.layout.token_mode:
            return {**info, "input_ids": abandoned, "keep": len(checkpoint.units)}
        # text mode: the units are characters
        text, tokenize = "".join(map(str, abandoned)), self.ctx.tokenize
        info["text"] = text
        if tokenize is not None:
            info["input_ids"] = tokenize(text)
            info["keep"] = len(tokenize("".join(map(str, checkpoint.units))))
        return info

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> Step:
        """One model call and its consequence: render -> generate -> append -> act.
        Raises RuntimeError when the run is over."""
        if self.done:
            raise RuntimeError(f"run is over ({self.status})")
        step = self._begin()
        prompt = self.layout.render()
        completion = self._call(prompt, step)
        if completion is None:
            self.status = "error"
            return step
        step.output = completion.text
        out = self.layout.add_assistant(completion.text, completion.output_ids)
        self.observer.generated(self.layout, prompt, completion, out)
        if step.kind != "reflect":
            self._act(step)
        self.observer.acted(step, self._record_kind(step))
        self._after(step)
        return step

    def _begin(self) -> Step:
        kind, self._next = self._next or "act", None
        if kind == "reflect":
            self.layout.add_message("user", prompts.REFLECT)
        step = Step(index=len(self.steps), branch=self.branch, kind=kind)
        self.steps.append(step)
        return step

    def _schema(self) -> str:
        calls = [
            (s.action.tool, s.action.arguments)
            for s in self.steps
            if not s.abandoned and s.action is not None and s.action.kind == "tool"
        ]
        allowed = allowed_actions(self.tool_choice, self.task, list(self.ctx.tools), first=not calls)
        # The same call twice in a row learns nothing new: small models loop on it, so the
        # next action must be an answer (or a declared dead end).
        answer_only = not allowed.tools or (len(calls) >= 2 and calls[-1] == calls[-2])
        # The last call a run may make answers (unless a tool call is still owed): a run does not
        # end at max_steps without an answer.
        # (`self.steps` already holds the step being decided: it is the last one when it reaches max_steps)
        answer_only = answer_only or (allowed.answer and len(self.steps) >= self.ctx.config.max_steps)
        numbers = self._numbers() if self.ctx.config.ground_numbers else None
        return action_schema(
            list(self.ctx.tools.values()),
            dead_end=self.ctx.config.dead_end,
            tools_only=not allowed.answer,
            answer_only=answer_only,
            allowed=allowed.tools,
            answer=self.answer_schema,
            numbers=numbers,
            arguments=self.argument_schemas,
        )

    def _numbers(self) -> list[int | float]:
        """Numbers the run has written so far: system text, task, calls and results (not the tool specs)."""
        head = self.layout.head().text
        log = self.layout.render(generation_prompt=False).text[len(head) :]
        return context_numbers(self.layout.system_text() + "\n" + log)

    def _call(self, prompt: Prompt, step: Step) -> Completion | None:
        schema = thought_schema() if step.kind == "reflect" else self._schema()
        params = {**self.sampling, "json_schema": schema}
        try:
            return self.generate(prompt, params, rid=f"{self.ctx.run_id}-b{self.branch}-s{step.index}")
        except RadixAgentError as exc:  # model errors are data in the step, and in the trace
            step.error = f"{type(exc).__name__}: {exc}"
            self.observer.failed(step, prompt)
            return None

    def generate(self, prompt: Prompt, params: dict[str, object], rid: str) -> Completion:
        """The run's one request type, built here and handed to the backend as it is."""
        ctx = self.ctx
        request = GenerationRequest.of(
            None if prompt.ids is not None else prompt.text,
            prompt.ids,
            params,
            session_id=ctx.session_id,
            cache_salt=ctx.cache_salt,
            priority=ctx.priority,
            rid=rid,
        )
        backend = ctx.backend
        if isinstance(backend, Backend):
            return backend.complete(request)
        # a duck-typed backend (not a Backend subclass, e.g. a wrapper): its keyword form
        return generate_by_keywords(backend.generate, request, type(backend).__name__)

    def _act(self, step: Step) -> None:
        try:
            action = parse_action(step.output)
        except ParseError as exc:
            self._fail(step, prompts.PARSE_ERROR.format(message=exc))
            return
        step.action = action
        if action.kind == "tool":
            self._run_tool(step, action)
        elif action.kind == "answer":
            self._answer(step, action.text or "")
        elif action.kind == "dead_end":
            note = prompts.DEAD_END_NOTE.format(reason=action.text)
            if not self._backtrack(note):
                self.status = "dead_end"

    def _run_tool(self, step: Step, action: Action) -> None:
        call_id = f"call_{step.index}"  # deterministic: the step number, never a random id
        tool = self.ctx.tools.get(action.tool or "")
        if tool is None:
            result = ToolResult(None, f"unknown tool {action.tool!r}", "unknown_tool")
        else:
            self.ctx.event("tool_wait", expected_s=tool.expected_s, tool=tool.name, branch=self.branch)
            result = tool.invoke(action.arguments)
            self.ctx.event("resume", branch=self.branch)
        step.tool = {
            "name": action.tool,
            "arguments": action.arguments,
            "result": result.result,
            "error": result.error,
        }
        if result.ok:
            self._errors = 0
            step.observation = prompts.OBSERVATION.format(call_id=call_id, content=result.result)
            self.layout.add_message("user", step.observation)
            return
        message = prompts.TOOL_ERROR.format(call_id=call_id, kind=result.error_kind, message=result.error)
        self._fail(step, message)

    def _fail(self, step: Step, observation: str) -> None:
        """A failed action: tell the model; reflect, or abandon the branch after repeated errors."""
        step.observation = observation
        self.layout.add_message("user", observation)
        self._errors += 1
        if self._errors >= self.ctx.config.max_errors:
            note = prompts.REPEATED_ERRORS_NOTE.format(count=self._errors, last=observation[:120])
            if self._backtrack(note):
                return
        if self.ctx.config.reflect_on_failure:
            self._next = "reflect"

    def _answer(self, step: Step, answer: str) -> None:
        if self.ctx.verify is None:
            self.answer, self.status = answer, "answered"
            return
        ok, reason = _verdict(self.ctx.verify, answer)
        self.verified = ok
        if ok:
            self.answer, self.status = answer, "answered"
            return
        if self._backtrack(prompts.REJECTED.format(answer=answer, reason=reason)):
            return
        step.observation = prompts.VERIFY_FAILED.format(answer=answer, reason=reason)
        if self.ctx.config.reflect_on_failure:
            self.layout.add_message("user", step.observation)
            self._next = "reflect"
        else:
            self.answer, self.status = answer, "rejected"

    def _backtrack(self, note: str) -> bool:
        if self._backtracks >= self.ctx.config.max_backtracks:
            return False
        self.rollback(self.checkpoints[-1], note)
        return True

    def _after(self, step: Step) -> None:
        every = self.ctx.config.reflect_every
        calls = len(self.steps)
        if not self.done and self._next is None and every and step.kind != "reflect" and calls % every == 0:
            self._next = "reflect"
        if not self.done and calls >= self.ctx.config.max_steps:
            self.status = "max_steps"

    # -- trace ---------------------------------------------------------------------------------

    def _record_kind(self, step: Step) -> str:
        if step.kind in ("reflect", "backtrack", "fork"):
            return step.kind
        return "answer" if step.action is not None and step.action.kind == "answer" else "act"

    def record_prefill(self, prompt: Prompt, completion: Completion) -> StepRecord:
        """Trace the shared-prefix prefill of a fork (no log change: branches start from `prompt`)."""
        step = Step(index=len(self.steps), branch=self.branch, kind="fork", output=completion.text)
        self.steps.append(step)
        ids = tuple(completion.output_ids) if self.layout.token_mode else None
        self.observer.generated(self.layout, prompt, completion, Piece(completion.text, ids))
        return self.observer.acted(step, self._record_kind(step))

    def result(self) -> RunResult:
        return RunResult(
            answer=self.answer,
            steps=self.steps,
            trace=self.trace,
            status=self.status,
            session_id=self.ctx.session_id,
            run_id=self.ctx.run_id,
            branch=self.branch,
            verified=self.verified,
        )

    def close(self) -> None:
        """Tell the backend the session is over (Agent.run does this; `start()` callers do it)."""
        self.ctx.event("close", run_id=self.ctx.run_id)

    def run_to_end(self) -> RunResult:
        while not self.done:
            self.step()
        return self.result()
