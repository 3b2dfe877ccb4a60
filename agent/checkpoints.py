"""Checkpoints of a run (points to roll back to) and what a run hands back: its steps (rich, in
memory) and its trace (the JSONL records)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.actions import Action
from agent.trace import StepRecord


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A point in a run's log to roll back to: the log length, the model-call count, and the
    prompt units (token ids, or characters in text mode) the next prompt must extend."""

    mark: int
    step: int
    units: Sequence[Hashable]


@dataclass(slots=True)
class Step:
    """One model call and what the agent did with it. Model/tool errors are data here."""

    index: int
    branch: int
    kind: str
    output: str = ""
    action: Action | None = None
    observation: str | None = None
    tool: dict[str, object] | None = None
    error: str | None = None
    record: StepRecord | None = None
    abandoned: bool = False  # rolled back: no longer on the live path


#: how a run ended ("running" only while it runs): answered, out of steps, its answer rejected by
#: the verifier, a dead end declared with no checkpoint left, or failed
RunStatus = Literal["running", "answered", "max_steps", "rejected", "dead_end", "error"]


@dataclass(slots=True)
class RunResult:
    answer: str | None
    steps: list[Step]
    trace: list[StepRecord]
    status: RunStatus
    session_id: str = ""
    run_id: str = ""
    branch: int = 0
    verified: bool | None = None  # None: no verify callback judged the final answer

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.trace)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.trace)

    @property
    def ideal_cached_tokens(self) -> int:
        return sum(r.ideal_cached_tokens for r in self.trace)

    @property
    def cache_fidelity(self) -> float:
        """cached / ideal over the run (1.0 when nothing could have been cached)."""
        ideal = self.ideal_cached_tokens
        return self.cached_tokens / ideal if ideal else 1.0

    @property
    def prefix_breaks(self) -> list[StepRecord]:
        return [r for r in self.trace if r.prefix_break is not None]


class ForkResult(list):
    """The branches' RunResults (in branch order) plus the shared-prefix prefill record."""

    def __init__(self, results: list[RunResult], prefill: StepRecord | None) -> None:
        super().__init__(results)
        self.prefill = prefill

    @property
    def best(self) -> RunResult | None:
        """First branch whose answer passed verify (or, without verify, was given at all)."""
        for result in self:
            if result.status == "answered" and result.verified is not False:
                return result
        return None
