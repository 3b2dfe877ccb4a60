"""The trace as an observer of a Run's step events.

`Run.step` renders, generates, appends and acts; it tells this observer what happened and the
observer does the accounting (runtime/trace/ledger.py: ideal hits, prefix breaks, miss causes), builds
the `StepRecord` and writes the trace line. The ledger is fed right after the model's turn is
appended, before acting: acting may roll back, which declares what the next prompt extends.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from agent import prompts
from agent.checkpoints import Step
from agent.layout import Piece, Prompt, PromptLayout
from agent.trace import StepRecord, TraceWriter, warn_prefix_break
from runtime.backends.base import Completion
from runtime.trace.ledger import Account, Served, StepAccounting, StepEvent


def served_from(completion: Completion) -> Served:
    """What the server said: the engine's `evicted_prefix_tokens` and `prefix_cache` when it
    reports them (ours does; others leave eviction `inferred`)."""
    return Served(
        prompt_tokens=completion.prompt_tokens,
        cached_tokens=completion.cached_tokens,
        evicted_tokens=completion.evicted_tokens,
        cache_off=not completion.prefix_cache,
    )


def worker_of(completion: Completion) -> str | None:
    """The worker that served the request, where a cluster says (meta_info.worker_id)."""
    return completion.worker_id


@dataclass(slots=True)
class _Pending:
    account: Account
    completion: Completion


class TraceObserver:
    """One per Run (branch). Not thread-safe; the ledgers it feeds are."""

    def __init__(
        self,
        accounting: StepAccounting,
        tokenize: Callable[[str], list[int]] | None,
        writer: TraceWriter | None,
        ids: tuple[str, str, int],  # run_id, session_id, branch
        salt: str | None = None,
    ) -> None:
        self.accounting, self.tokenize, self.writer = accounting, tokenize, writer
        self.run_id, self.session_id, self.branch = ids
        self.salt = salt
        self.trace: list[StepRecord] = []
        self.last_full: Sequence[Hashable] = ()  # latest prompt+output sent on this branch
        self._pending: _Pending | None = None

    # -- step events --------------------------------------------------------------------------

    def generated(self, layout: PromptLayout, prompt: Prompt, completion: Completion, out: Piece) -> None:
        """The model answered `prompt` and its turn `out` was appended to `layout`."""
        sent = break_units(prompt)
        sent_out: Sequence[Hashable] = out.ids if out.ids is not None else out.text
        units = self._ideal_units(prompt)
        outputs: Sequence[Hashable] = out.text
        if not isinstance(units, str):
            outputs = completion.output_ids or (self.tokenize(completion.text) if self.tokenize else out.text)
        if self.accounting.ideal is self.accounting.breaks:
            outputs = sent_out
        event = StepEvent(
            branch=self.branch,
            sent=sent,
            sent_output=sent_out,
            units=units,
            outputs=outputs,
            served=served_from(completion),
            completion_tokens=completion.completion_tokens,
            salt=self.salt,
            worker=worker_of(completion),
            output_tail=prompts.ASSISTANT_CLOSE,
            rewrites=layout.take_rewrites(),
        )
        account = self.accounting.observe(event)
        if account.prefix_break is not None:
            decode = self.accounting.breaks.render_units
            account.prefix_break["piece"] = layout.locate(account.prefix_break["offset"], decode)
        self.last_full = list(sent) + list(sent_out)
        self._pending = _Pending(account, completion)

    def acted(self, step: Step, kind: str) -> StepRecord:
        """The step's consequence is known: write its record."""
        pending, self._pending = self._pending, None
        assert pending is not None, "acted() without generated()"
        c, a = pending.completion, pending.account
        record = StepRecord(
            run_id=self.run_id,
            session_id=self.session_id,
            branch=self.branch,
            step=step.index,
            kind=kind,
            prompt_tokens=c.prompt_tokens,
            cached_tokens=c.cached_tokens,
            ideal_cached_tokens=a.ideal_cached_tokens,
            completion_tokens=c.completion_tokens,
            ttft_s=c.ttft_s,
            latency_s=c.latency_s,
            finish_reason=c.finish_reason,
            prefix_break=a.prefix_break,
            tool=step.tool,
            miss=a.miss,
        )
        return self._emit(step, record)

    def failed(self, step: Step, prompt: Prompt) -> StepRecord:
        """The model call raised: the step is recorded with nothing served."""
        tokens = len(prompt.ids) if prompt.ids is not None else 0
        record = StepRecord(
            run_id=self.run_id,
            session_id=self.session_id,
            branch=self.branch,
            step=step.index,
            kind=step.kind,
            prompt_tokens=tokens,
            cached_tokens=0,
            ideal_cached_tokens=0,
            completion_tokens=0,
            ttft_s=0.0,
            latency_s=0.0,
            finish_reason="error",
            prefix_break=None,
            tool=None,
        )  # miss stays None: the request never reached a cache
        return self._emit(step, record)

    # -- helpers ------------------------------------------------------------------------------

    def _ideal_units(self, prompt: Prompt) -> Sequence[Hashable]:
        if prompt.ids is not None:
            return prompt.ids
        return self.tokenize(prompt.text) if self.tokenize else prompt.text

    def _emit(self, step: Step, record: StepRecord) -> StepRecord:
        step.record = record
        self.trace.append(record)
        if self.writer is not None:
            self.writer.write(record)
        if record.prefix_break is not None:
            warn_prefix_break(record)
        return record


def break_units(prompt: Prompt) -> Sequence[Hashable]:
    """What prefix breaks compare: the ids sent, or the text sent."""
    return prompt.ids if prompt.ids is not None else prompt.text
