"""First-attempt accuracy of the reasoning agent: one calculator expression per problem, no verifier.

The reasoning suite's score mixes what the model can do with what the verifier's rollbacks buy
(each rejected answer reopens the calculator). This probe isolates the model: the agent of
`tasks.reasoning` (same head, task turn and expression grammar) makes exactly one calculator call,
whose value is scored. It runs the bundled arithmetic and constraint problems (the logic puzzles
take no expression) and the held-out set `reasoning_heldout.jsonl`, written once and never tuned
on, so a prompt change can be judged on both.

    python -m evals.reasoning_probe [--backend embedded|http://host:port]
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass

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

    @property
    def correct(self) -> bool:
        return self.value is not None and is_correct(self.value, self.question.answer or [])


def first_attempt(backend: Backend, question: Question) -> tuple[str | None, str | None]:
    """The expression of the agent's first (forced) calculator call and its value; None when the
    call failed (invalid expression, grammar dead end)."""
    agent = reasoning_agent(backend, max_steps=1, reflect=False)
    run = start_problem(agent, question)
    try:
        run.tool_choice = "required"
        call = run.step().tool or {}
    finally:
        run.close()
        agent.close()
    expression = (call.get("arguments") or {}).get("expression")
    value = call.get("result")
    return expression, None if value is None else str(value)


def probe(backend: Backend) -> list[Attempt]:
    attempts = []
    for name in SETS:
        for question in load_questions(data_path(name)):
            if question.meta.get("kind") == "logic":
                continue
            attempts.append(Attempt(name, question, *first_attempt(backend, question)))
    return attempts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evals.reasoning_probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--backend", default="embedded", help="embedded (default) or a server URL")
    args = parser.parse_args(argv)
    attempts = probe(open_backend(args.backend))
    right, total = Counter[str](), Counter[str]()
    for a in attempts:
        total[a.set_name] += 1
        right[a.set_name] += a.correct
        mark = "ok" if a.correct else "--"
        print(
            f"{mark} {a.question.id:11} {a.expression or '(no call)':42} = {a.value}  gold {a.question.answer[0]}"
        )
    for name in SETS:
        print(f"{name}: {right[name]}/{total[name]} right at the first attempt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
