"""The reasoning suite: the safe calculator, answer checking, the verifier's rollback, one real run."""

from __future__ import annotations

from typing import Any

import pytest

from agent import ToolError
from tasks.questions import Question
from tasks.reasoning import calculator_tool, evaluate, is_correct, solve
from tests.support.fake_backend import ReplyBackend


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12*24-150-18", 120),
        ("(13*60+15)-(9*60+40)", 215),
        ("2**10%7", 2),
        ("1/(1/6+1/12)", 4),
        ("max(3, 7)-abs(-2)", 5),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == value
    assert calculator_tool().invoke({"expression": expression}).result == str(value)


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "x + 1", "9**999", "1/0", "[1, 2]", "(1).real", "2 +"]
)
def test_calculator_refuses_anything_else(expression: str) -> None:
    with pytest.raises(ToolError):
        evaluate(expression)
    assert not calculator_tool().invoke({"expression": expression}).ok


def test_is_correct_numbers_and_names() -> None:
    assert is_correct("The answer is 120.", ["120"]) and not is_correct("1200", ["120"])
    assert is_correct("Carol owns the cat", ["Carol"]) and not is_correct("Alice", ["Carol"])


def test_wrong_answer_is_rejected_then_rolled_back() -> None:
    outputs = [
        '{"tool":"calculator","arguments":{"expression":"12*24-150"}}',
        '{"answer":"138"}',  # wrong: the verifier rejects it and the run rolls back
        '{"tool":"calculator","arguments":{"expression":"12*24-150-18"}}',
        '{"answer":"120"}',
    ]
    backend = ReplyBackend.replaying(outputs)
    question = Question(id="r1", question="A baker makes 12 trays of 24 cookies...", answer=["120"])
    res = solve(backend, question, max_steps=6)
    assert res.correct is True and res.result.status == "answered"
    kinds = [r.kind for r in res.result.trace]
    assert kinds == ["act", "answer", "backtrack", "answer"]
    assert [s.abandoned for s in res.result.steps] == [True, True, False, False]
    assert all(p["temperature"] == 0.0 for p in backend.params)


@pytest.mark.slow
def test_reasoning_end_to_end_on_the_engine(engine: Any) -> None:
    from runtime.backends.embedded import EmbeddedBackend

    question = Question(
        id="r9", question="What is the remainder when 2 to the power of 10 is divided by 7?", answer=["2"]
    )
    res = solve(EmbeddedBackend(engine), question, max_steps=2)
    assert res.result.status in {"answered", "max_steps", "rejected"}
    assert 1 <= len(res.result.trace) <= 2 and res.correct in (True, False)
    assert all(r.prefix_break is None for r in res.result.trace)
    engine.check_integrity()


def test_task_turn_leads_with_the_most_similar_worked_example():
    from tasks.reasoning import nearest_example, task_text

    question = "A ferry leaves at 07:50 and arrives at 10:10. How many minutes is the crossing?"
    problem, expression, _ = nearest_example(question)
    assert "08:25" in problem and expression == "(11*60+5)-(8*60+25)"
    text = task_text(question)
    assert text.index(problem) < text.index(question) and text.endswith(question)


def test_rejected_answers_are_collected_for_the_grammar():
    from tasks.reasoning import make_verifier

    rejected: list[str] = []
    verify = make_verifier(Question(id="q", question="2+2?", answer=["4"]), rejected)
    assert verify("5")[0] is False and verify("4")[0] is True and rejected == ["5"]


def test_expression_grammar_takes_the_problems_numbers_only():
    import re

    from tasks.reasoning import problem_arguments

    question = (
        "A train leaves at 09:40 and arrives at 13:15 the same day. How many minutes does the journey take?"
    )
    pattern = problem_arguments(question)["properties"]["expression"]["pattern"]
    ok = ["(13*60+15)-(9*60+40)", "13*60+15-9*60-40", "min(40, 15)", "abs(-5)+2**3", "100//9"]
    bad = ["13*60+16", "1315-940", "13:15-9:40", "thirteen*60", "13 * 60", "", "12*24-150"]
    assert all(re.fullmatch(pattern.strip("^$"), e) for e in ok)
    assert not any(re.fullmatch(pattern.strip("^$"), e) for e in bad)
    for expression in ok:  # everything the grammar lets through is something the calculator reads
        evaluate(expression)


def test_solve_narrows_the_calculator_to_the_problems_numbers():
    import json

    outputs = ['{"tool":"calculator","arguments":{"expression":"12*24-150-18"}}', '{"answer":"120"}']
    backend = ReplyBackend.replaying(outputs)
    question = Question(id="r1", question="A baker makes 12 trays of 24 cookies...", answer=["120"])
    solve(backend, question, max_steps=4)
    first = json.loads(backend.params[0]["json_schema"])
    call = next(b for b in first["anyOf"] if "tool" in b["properties"])
    pattern = call["properties"]["arguments"]["properties"]["expression"]["pattern"]
    assert "(100|10|12|24" in pattern and "150" not in pattern  # the problem's numbers (150 not in its text)


def test_answer_after_a_result_is_that_result_and_a_rejected_value_is_not_recomputed():
    import json

    outputs = [
        '{"tool":"calculator","arguments":{"expression":"12*24-150"}}',
        '{"answer":"138"}',  # rejected: the run rolls back
        '{"tool":"calculator","arguments":{"expression":"12*24-150"}}',  # the same value again: refused
        '{"thought":"subtract the 18 given away too"}',
        '{"tool":"calculator","arguments":{"expression":"12*24-150-18"}}',
        '{"answer":"120"}',
    ]
    backend = ReplyBackend.replaying(outputs)
    question = Question(id="r1", question="A baker makes 12 trays of 24 cookies...", answer=["120"])
    res = solve(backend, question, max_steps=8)
    assert res.correct is True
    refused = [s.tool for s in res.result.steps if s.tool is not None and s.tool["error"]]
    assert len(refused) == 1 and "138" in refused[0]["error"]
    schemas = [json.loads(p["json_schema"]) for p in backend.params]
    answer_after_138 = next(b for b in schemas[1]["anyOf"] if "answer" in b["properties"])
    assert answer_after_138["properties"]["answer"]["pattern"] == "^138$"
    assert [b for b in schemas[1]["anyOf"] if "tool" in b["properties"]] == []  # tool_choice none
    final = next(b for b in schemas[5]["anyOf"] if "answer" in b["properties"])
    assert final["properties"]["answer"]["pattern"] == "^120$"


@pytest.mark.slow
def test_reasoning_probe_scores_the_first_forced_calculator_call(engine: Any) -> None:
    from evals.suites.reasoning_probe import first_attempt
    from runtime.backends.embedded import EmbeddedBackend
    from tasks.reasoning import evaluate

    question = Question(
        id="p1",
        question="A baker makes 12 trays of 24 cookies. She sells 150 cookies and gives away 18. How many cookies are left?",
        answer=["120"],
    )
    expression, value = first_attempt(EmbeddedBackend(engine), question)
    # The first action is forced to be a calculator call: an expression over the problem's numbers.
    assert expression is not None and value == str(evaluate(expression))
    engine.check_integrity()


def test_probe_ranks_the_gold_value_by_how_often_the_attempts_gave_it() -> None:
    from evals.suites.reasoning_probe import Attempt

    q = Question(id="p2", question="?", answer=["120"])
    # greedy 7, samples: 9 twice, 120 once, a failed call: 9 is the most frequent, then 7, then 120
    attempt = Attempt("set", q, "3+4", "7", ("9", "120", "9", None))
    assert not attempt.correct
    assert attempt.gold_rank() == 2
    assert Attempt("set", q, "3+4", "7", ("9", None)).gold_rank() is None
    assert Attempt("set", q, "100+20", "120").gold_rank() == 0
