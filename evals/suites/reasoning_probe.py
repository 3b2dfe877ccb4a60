"""First-attempt accuracy of the reasoning agent: one calculator expression per problem, no verifier.

The reasoning suite's score mixes what the model can do with what the verifier's rollbacks buy
(each rejected answer reopens the calculator). This probe isolates the model: the agent of
`tasks.reasoning` (same head, task turn and expression grammar) makes exactly one calculator call,
whose value is scored. It runs the bundled arithmetic and constraint problems (the logic puzzles
take no expression) and the held-out set `reasoning_heldout.jsonl`, written once and never tuned
on, so a prompt change can be judged on both.

    python -m evals.suites.reasoning_probe [--backend embedded|http://host:port] [--samples K]

`--samples K` adds K-1 sampled first attempts per problem (temperature `--temperature`, seeds
1..K-1, each a fork of the same cached head) to the greedy one, and reports how often the gold
value is among the K values and among the 3 most frequent (what a vote over forks, checked by a
verifier with two rollbacks, could reach).
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runtime.backends.base import Backend
from tasks import data_path
from tasks.backend_setup import open_backend
from tasks.questions import Question, load_questions
from tasks.reasoning import is_correct, reasoning_agent, start_problem

SETS = ("reasoning.jsonl", "reasoning_heldout.jsonl")


@dataclass(frozen=True, slots=True)
class Attempt:
    set_name: str
    question: Question
    expression: str | None
    value: str | None
    #: the values of the sampled attempts (`--samples`), None where a call failed
    sampled: tuple[str | None, ...] = field(default=())

    @property
    def correct(self) -> bool:
        return self.value is not None and is_correct(self.value, self.question.answer or [])

    def gold_rank(self) -> int | None:
        """Rank of the gold value among the greedy and sampled values by frequency (0: the most
        frequent; ties in first-seen order), None when no attempt gave it."""
        counts = Counter(v for v in (self.value, *self.sampled) if v is not None)
        ranked = [v for v, _ in counts.most_common()]
        return next((i for i, v in enumerate(ranked) if is_correct(v, self.question.answer or [])), None)


def first_attempt(
    backend: Backend, question: Question, sampling: dict[str, Any] | None = None
) -> tuple[str | None, str | None]:
    """The expression of the agent's first (forced) calculator call and its value; None when the
    call failed (invalid expression, grammar dead end). `sampling`: this attempt's sampling
    parameters instead of the agent's greedy ones."""
    agent = reasoning_agent(backend, max_steps=1, reflect=False)
    run = start_problem(agent, question)
    try:
        run.tool_choice = "required"
        if sampling is not None:
            run.sampling = {**run.sampling, **sampling}
        call = run.step().tool or {}
    finally:
        run.close()
        agent.close()
    expression = (call.get("arguments") or {}).get("expression")
    value = call.get("result")
    return expression, None if value is None else str(value)


def probe(backend: Backend, samples: int = 1, temperature: float = 0.8) -> list[Attempt]:
    attempts = []
    for name in SETS:
        for question in load_questions(data_path(name)):
            if question.meta.get("kind") == "logic":
                continue
            sampled = tuple(
                first_attempt(backend, question, {"temperature": temperature, "seed": seed})[1]
                for seed in range(1, samples)
            )
            attempts.append(Attempt(name, question, *first_attempt(backend, question), sampled))
    return attempts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evals.suites.reasoning_probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--backend", default="embedded", help="embedded (default) or a server URL")
    parser.add_argument("--samples", type=int, default=1, help="attempts per problem: greedy + K-1 sampled")
    parser.add_argument("--temperature", type=float, default=0.8, help="of the sampled attempts")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.temperature <= 0:
        parser.error("--samples must be at least 1 and --temperature above 0")
    attempts = probe(open_backend(args.backend), args.samples, args.temperature)
    right, total, anywhere, top3 = Counter[str](), Counter[str](), Counter[str](), Counter[str]()
    for a in attempts:
        total[a.set_name] += 1
        right[a.set_name] += a.correct
        rank = a.gold_rank()
        anywhere[a.set_name] += rank is not None
        top3[a.set_name] += rank is not None and rank < 3
        mark = "ok" if a.correct else "--"
        extra = f"  gold rank {rank} of {len(set(a.sampled) | {a.value})}" if a.sampled else ""
        print(
            f"{mark} {a.question.id:11} {a.expression or '(no call)':42} = {a.value}  gold {(a.question.answer or ['?'])[0]}{extra}"
        )
    for name in SETS:
        line = f"{name}: {right[name]}/{total[name]} right at the first attempt"
        if args.samples > 1:
            line += (
                f"; gold among {args.samples} attempts (T={args.temperature}) {anywhere[name]}/{total[name]},"
                f" among the 3 most frequent {top3[name]}/{total[name]}"
            )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
