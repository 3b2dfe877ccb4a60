"""Question / chat JSONL loading: validation at the I/O edge, errors that name file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks import data_path
from tasks.errors import TaskInputError
from tasks.questions import ChatPrompt, Question, dump_jsonl, load_chat_prompts, load_questions
from tasks.scoring import numeric_match


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_valid_questions(tmp_path: Path) -> None:
    path = write(
        tmp_path / "qs.jsonl",
        json.dumps({"id": "a", "question": " What is the code? ", "answer": "4172"}),
        "",
        json.dumps(
            {"question": "Where is the key?", "answer": ["under the mat", "mat"], "meta": {"depth": 0.5}}
        ),
        json.dumps({"id": 7, "question": "How many?", "answers": 3, "extra": "ignored"}),
        json.dumps({"question": "No gold here?"}),
    )
    qs = load_questions(path)
    assert [q.id for q in qs] == ["a", "qs-3", "7", "qs-5"]
    assert qs[0].question == "What is the code?" and qs[0].answer == ["4172"]
    assert qs[1].answer == ["under the mat", "mat"] and qs[1].meta == {"depth": 0.5}
    assert qs[2].answer == ["3"]
    assert qs[3].answer is None


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"question": "unterminated', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"answer": "x"}', "question"),
        ('{"question": "   "}', "blank"),
        ('{"question": "q", "answer": []}', "empty"),
        ('{"question": "q", "answer": {"a": 1}}', "answer"),
        ('{"question": "q", "answer": [true]}', "answer"),
        ('{"id": "a", "question": "dup"}', "duplicate id 'a' \\(first on line 1\\)"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = write(tmp_path / "bad.jsonl", '{"id": "a", "question": "fine"}', "", bad_line)
    with pytest.raises(TaskInputError, match=message) as info:
        load_questions(path)
    assert (info.value.path, info.value.line) == (str(path), 3)
    assert str(info.value).startswith(f"{path}:3: ")


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TaskInputError, match="file not found"):
        load_questions(tmp_path / "absent.jsonl")
    with pytest.raises(TaskInputError, match="no entries"):
        load_questions(write(tmp_path / "empty.jsonl", "", "  "))


def test_error_is_picklable() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(TaskInputError("f.jsonl", 4, "bad")))
    assert (err.path, err.line, err.message, str(err)) == ("f.jsonl", 4, "bad", "f.jsonl:4: bad")


def test_chat_prompts(tmp_path: Path) -> None:
    path = write(tmp_path / "chat.jsonl", '{"id": "c1", "turns": ["hi"]}', '{"turns": ["a", "b"]}')
    assert [c.turns for c in load_chat_prompts(path)] == [["hi"], ["a", "b"]]
    bad = write(tmp_path / "bad.jsonl", '{"id": "c1", "turns": []}')
    with pytest.raises(TaskInputError, match="turns") as info:
        load_chat_prompts(bad)
    assert info.value.line == 1


def test_dump_round_trip(tmp_path: Path) -> None:
    rows = [Question(id="x", question="q?", answer="a"), Question(id="y", question="r?")]
    dump_jsonl(tmp_path / "out.jsonl", rows)
    assert load_questions(tmp_path / "out.jsonl") == rows


def _safe_eval(expression: str) -> float:
    allowed = {"min": min, "max": max, "sum": sum, "next": next, "range": range, "all": all, "abs": abs}
    return eval(expression, {"__builtins__": {}, **allowed})  # test-only: our own bundled expressions


def test_bundled_reasoning_answers_are_right() -> None:
    problems = load_questions(data_path("reasoning.jsonl"))
    assert len(problems) >= 20
    assert {p.meta["kind"] for p in problems} == {"arith", "logic", "constraint"}
    for p in problems:
        assert p.answer and len(p.answer) == 1
        if "solution" in p.meta:
            assert numeric_match(str(_safe_eval(p.meta["solution"])), p.answer[0]) == 1.0, p.id


def test_held_out_reasoning_answers_are_right() -> None:
    problems = load_questions(data_path("reasoning_heldout.jsonl"))
    assert len(problems) == 10
    for p in problems:
        assert numeric_match(str(_safe_eval(p.meta["solution"])), p.answer[0]) == 1.0, p.id


def test_bundled_chat_prompts() -> None:
    prompts = load_chat_prompts(data_path("chat.jsonl"))
    assert len(prompts) == 20 and all(isinstance(p, ChatPrompt) for p in prompts)
    assert sum(len(p.turns) > 1 for p in prompts) >= 6
    # Little shared prefix: no two conversations open with the same three words.
    openings = [" ".join(p.turns[0].split()[:3]) for p in prompts]
    assert len(set(openings)) == len(openings)


def test_data_path_unknown_name() -> None:
    with pytest.raises(TaskInputError, match="available: .*reasoning.jsonl"):
        data_path("nope.jsonl")
