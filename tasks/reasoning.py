"""Reasoning with backtracking: word problems and puzzles, a calculator tool, a gold-checking verifier.

Each problem is one agent run (greedy). The agent may call `calculator` (a safe arithmetic evaluator
over Python's AST: numbers, + - * / // % **, parentheses, min/max/abs/round) any number of times;
its final answer goes to a verifier that compares it with the gold answer and rejects a wrong one,
so the run rolls back to its checkpoint with a note, reflects and tries again: the suite exercises
tool calls, reflection and rollback, and therefore the cache's handling of abandoned branches.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent import Agent, Run, RunResult, Step, Tool, ToolError, tool
from agent.constraints import context_numbers, escape, not_words_pattern
from agent.examples import answer_json, call_json
from runtime.backends.base import Backend
from tasks import prompts
from tasks.backend_setup import GREEDY, with_cache
from tasks.documents import search_terms
from tasks.outcomes import ItemOutcome, SuiteOptions, SuiteOutcome
from tasks.output import progress_bar
from tasks.questions import Question
from tasks.scoring import contains_match, extract_number, numeric_match

REASONING_MAX_STEPS = 8
REASONING_MAX_NEW_TOKENS = 48
DEFAULT_PROBLEMS = 6  # the suite's default size: each problem costs several model calls on 2 cores

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs, "round": round}
MAX_EXPONENT = 64
MAX_EXPRESSION = 200
#: numbers an expression may use beside the problem's own: small counts ("three", "twice") and the
#: unit factors a word problem leaves unsaid (months, hours per day, minutes per hour, percent)
CONSTANTS: tuple[int, ...] = (*range(11), 12, 24, 60, 100)
_OPEN = r"(\(|min\(|max\(|abs\(|round\(|-)"  # before a number: parentheses, functions, a minus
_OPERATOR = r"(\+|-|\*|\*\*|/|//|%|, ?)"  # between numbers (after closing parentheses)


def evaluate(expression: str) -> int | float:
    """Value of an arithmetic expression; raises ToolError for anything else (names, huge powers...)."""
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters", "validation")
    try:
        tree = ast.parse(expression.strip().replace("^", "**").replace("×", "*"), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression: {exc.msg}", "validation") from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero", "exception") from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return round(value, 10) if isinstance(value, float) else value


def _eval(node: ast.AST) -> Any:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent above {MAX_EXPONENT}", "validation")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords or not node.args:
            raise ToolError(f"{node.func.id}() takes positional numbers", "validation")
        return _FUNCTIONS[node.func.id](*(_eval(arg) for arg in node.args))
    raise ToolError(
        f"unsupported element {type(node).__name__} (only numbers and + - * / // % **)", "validation"
    )


def _spell(number: int | float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def expression_pattern(numbers: Sequence[int | float]) -> str:
    """Anchored regex of calculator expressions, without spaces, whose every number is one of
    `numbers` or CONSTANTS: the grammar keeps a small model from inventing quantities ("12*24-180")
    or writing words into the expression. Parentheses are not balanced by a regex; the evaluator
    reports an unbalanced one as an error the model can correct."""
    spelled = sorted({_spell(n) for n in (*numbers, *CONSTANTS) if n >= 0}, key=lambda t: (-len(t), t))
    number = "(" + "|".join(escape(t) for t in spelled) + ")"
    return f"^{_OPEN}*{number}(\\)*{_OPERATOR}{_OPEN}*{number})*\\)*$"


def problem_arguments(question: str) -> dict[str, Any]:
    """The calculator's arguments schema for one problem: an expression over its numbers."""
    pattern = expression_pattern(context_numbers(question))
    return {
        "type": "object",
        "properties": {"expression": {"type": "string", "pattern": pattern}},
        "required": ["expression"],
        "additionalProperties": False,
    }


def calculator_tool(rejected: Sequence[str] = ()) -> Tool:
    """The calculator. `rejected`: answers the verifier refused (read at each call); an expression
    whose value is one of them is refused with a note, so a retry computes something else instead
    of repeating the rejected attempt (greedy decoding would)."""

    def calculator(expression: str) -> str:
        """Evaluate one arithmetic expression and return its value.

        Args:
            expression: e.g. "12*24-150-18" or "(13*60+15)-(9*60+40)"
        """
        value = evaluate(expression)
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError("the result is not a finite number", "exception")
        if str(value) in rejected:
            raise ToolError(prompts.CALCULATOR_REPEATED.format(value=value), "validation")
        return str(value)

    return tool(calculator, description=prompts.CALCULATOR_DOC)


def is_correct(answer: str, golds: Sequence[str]) -> bool:
    """Numeric golds: the last number of the answer equals one. Otherwise: a gold word is contained."""
    for gold in golds:
        if extract_number(gold) is not None and numeric_match(answer, gold):
            return True
        if extract_number(gold) is None and contains_match(answer, gold):
            return True
    return False


def make_verifier(question: Question, rejected: list[str] | None = None) -> Callable[[str], tuple[bool, str]]:
    """Rejects a wrong final answer (the gold is known) without revealing the right one; each
    rejected answer is appended to `rejected`."""

    def verify(answer: str) -> tuple[bool, str]:
        if question.answer is None:
            return True, "no gold answer to check against"
        if is_correct(answer, question.answer):
            return True, "correct"
        if rejected is not None:
            rejected.append(answer)
        return False, "the answer is wrong; recheck each step with the calculator"

    return verify


def examples_text() -> str:
    """The worked examples as one system-prompt section. Measured on the bundled problems, this
    compact form beats demonstrated turns (agent `Example`s) for the calculator habit."""
    body = "\n\n".join(
        prompts.REASONING_EXAMPLE.format(
            problem=p, call=call_json("calculator", {"expression": e}), result=r, answer=answer_json(r)
        )
        for p, e, r in prompts.REASONING_EXAMPLES
    )
    return prompts.REASONING_EXAMPLES_SECTION.format(examples=body)


def nearest_examples(question: str) -> list[tuple[str, str, str]]:
    """The worked examples, most content words shared with `question` first (file order on ties)."""
    asked = set(search_terms(question))
    return sorted(prompts.REASONING_EXAMPLES, key=lambda ex: -len(asked & set(search_terms(ex[0]))))


def nearest_example(question: str) -> tuple[str, str, str]:
    """The worked example that shares the most content words with `question` (first on ties)."""
    return nearest_examples(question)[0]


def task_text(question: str) -> str:
    problem, expression, _ = nearest_example(question)
    return prompts.REASONING_TASK_WITH_EXAMPLE.format(
        problem=problem, expression=expression, question=question
    )


def results_answer_schema(run: Any, rejected: Sequence[str]) -> dict[str, Any] | None:
    """The answer's schema: right after a calculator result, that result (the answer step reads the
    tool's output instead of re-deriving it); otherwise any answer but a rejected one."""
    if _just_computed(run):
        live = [s for s in run.steps if not s.abandoned and s.tool is not None]
        result = str(live[-1].tool["result"])
        if result not in rejected:
            return {"type": "string", "pattern": "^" + escape(result) + "$"}
    return {"type": "string", "pattern": not_words_pattern(rejected)} if rejected else None


def _just_computed(run: Any) -> bool:
    """The live path ends in a successful calculator call: the next action answers with it.

    The worked examples solve each problem in one expression; letting the model call again on its
    own result makes a small model drift (x*2+9, then that*2+9, ...). A wrong answer is rejected by
    the verifier and rolls back, which re-opens the calculator for a different expression.
    """
    live = [s for s in run.steps if not s.abandoned and s.action is not None and s.kind != "reflect"]
    return bool(live) and live[-1].action.kind == "tool" and (live[-1].tool or {}).get("error") is None


@dataclass(slots=True)
class ProblemResult:
    question: Question
    result: RunResult
    correct: bool | None
    seconds: float


def reasoning_agent(backend: Backend, rejected: Sequence[str] = (), **config: Any) -> Agent:
    """The reasoning agent: the cached head (system + worked examples) and the calculator, greedy;
    `config`: the rest of the Agent's settings (steps, reflection, verifier)."""
    return Agent(
        backend,
        system=prompts.REASONING_SYSTEM + examples_text(),
        tools=[calculator_tool(rejected)],
        dead_end=False,
        examples=(),
        sampling={**GREEDY, "max_new_tokens": REASONING_MAX_NEW_TOKENS},
        **config,
    )


def start_problem(agent: Agent, question: Question) -> Run:
    """A run of `agent` on one problem: the task turn with its nearest example, the calculator's
    expressions limited to the problem's numbers."""
    run = agent.start(task_text(question.question))
    run.argument_schemas = {"calculator": problem_arguments(question.question)}
    return run


def solve(
    backend: Backend,
    question: Question,
    *,
    max_steps: int = REASONING_MAX_STEPS,
    on_step: Callable[[Question, Step], None] | None = None,
) -> ProblemResult:
    """One problem: an agent run whose verifier knows the gold answer."""
    rejected: list[str] = []
    agent = reasoning_agent(
        backend,
        rejected,
        max_steps=max_steps,
        reflect=True,
        verify=make_verifier(question, rejected),
        max_backtracks=2,
    )
    started = time.perf_counter()
    run = start_problem(agent, question)
    try:
        while not run.done:
            run.tool_choice = "none" if _just_computed(run) else "auto"
            # The answer after a result is that result; a rejected answer is never given again.
            run.answer_schema = results_answer_schema(run, rejected)
            step = run.step()
            if on_step is not None:
                on_step(question, step)
    finally:
        run.close()
        agent.close()
    result = run.result()
    correct = (
        None
        if question.answer is None
        else bool(result.answer and is_correct(result.answer, question.answer))
    )
    return ProblemResult(question, result, correct, time.perf_counter() - started)


def load_problems(limit: int | None = None) -> list[Question]:
    from tasks import data_path
    from tasks.questions import load_questions

    return load_questions(data_path("reasoning.jsonl"))[: limit or DEFAULT_PROBLEMS]


def run_reasoning_suite(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    """The eval's "reasoning" suite: `options.limit` problems (default DEFAULT_PROBLEMS), in file order."""

    backend = with_cache(backend, options.prefix_cache)
    problems = load_problems(options.limit)
    items: list[ItemOutcome] = []
    started = time.perf_counter()
    with progress_bar(options.progress, "reasoning", len(problems)) as advance:
        for question in problems:
            res = solve(backend, question)
            items.append(
                ItemOutcome(
                    question.id, res.result.answer, res.correct, res.result.status, list(res.result.trace)
                )
            )
            advance()
    return SuiteOutcome("reasoning", items, time.perf_counter() - started)
