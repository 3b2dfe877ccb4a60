"""The long-document QA runner: flow and outputs on a scripted backend, bad inputs, a partial run,
and one end-to-end run on the real embedded engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tasks.backend_setup import context_limit, with_cache
from tasks.citations import check_answer, strip_refs
from tasks.documents import Document, load_document
from tasks.errors import TaskInputError
from tasks.qa import run_qa
from tasks.qa_cli import main, summarize
from tasks.questions import Question
from tests.support.fake_backend import ReplyBackend

DOC_TEXT = (
    "The harbour town wakes early and the boats leave before dawn.\n"
    "The secret code of the green door is 5120. Nobody else knows it.\n"
    "Fishermen mend their nets on the quay in the afternoon.\n"
    "Maria hid the spare key under the stone frog by the well.\n"
    "In the evening the market fills with the smell of grilled sardines."
)


def scripted(reply: Callable[[str], str]) -> ReplyBackend:
    """Text-mode fake: `reply(prompt)` gives the model's output; every call is recorded."""
    return ReplyBackend(lambda prompt, _params: reply(prompt))


def _doc(tmp_path: Path, text: str = DOC_TEXT) -> Document:
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    return load_document(path)


QUESTIONS = [
    Question(id="q1", question="What is the secret code of the green door?", answer=["5120"]),
    Question(id="q2", question="Where did Maria hide the spare key?", answer=["under the stone frog"]),
]


def _answers(prompt: str) -> str:
    """Search first; then copy the answer from the observation (wrong once for Maria's key)."""
    last = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if not last.startswith("Observation"):
        return '{"tool":"search_document","arguments":{"query":"key words"}}'
    if "5120" in last:
        return '{"answer":"5120"}'
    if "A previous attempt" in prompt:  # after the rollback note: the right answer
        return '{"answer":"under the stone frog by the well"}'
    return '{"answer":"The moon is made of cheese"}'


def test_verifier_accepts_cited_and_grounds_uncited(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    cited = check_answer(doc, "What is the secret code of the green door?", "5120 (L2)")
    assert cited.ok and cited.citations == (2,) and cited.cited_by == "model"
    grounded = check_answer(doc, "Where did Maria hide the spare key?", "under the stone frog")
    assert grounded.ok and 4 in grounded.citations and grounded.cited_by == "verifier"
    wrong = check_answer(doc, "Where did Maria hide the spare key?", "in the moon (L1)")
    assert not wrong.ok and "moon" in wrong.reason
    assert strip_refs("5120 (L2-L3).") == "5120"


def test_run_qa_writes_answers_and_trace_and_backtracks(tmp_path: Path) -> None:
    backend = scripted(_answers)
    report = run_qa(backend, _doc(tmp_path), QUESTIONS, out_dir=tmp_path / "out", max_steps=4)
    rows = [json.loads(line) for line in (tmp_path / "out" / "answers.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2"]
    assert rows[0]["correct"] is True and rows[0]["paragraphs"] == [1] and rows[0]["cited_by"] == "evidence"
    assert rows[1]["correct"] is True and rows[1]["steps"] == 4  # rejected once, rolled back, answered
    for key in (
        "question",
        "answer",
        "exact",
        "contains",
        "f1",
        "prompt_tokens",
        "cached_tokens",
        "ttft_s",
        "latency_s",
    ):
        assert key in rows[0]
    trace = [json.loads(line) for line in (tmp_path / "out" / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["kind"] == "fork" and trace[0]["completion_tokens"] == 0  # the head's prefill, first
    assert [t["kind"] for t in trace[1:]] == ["act", "answer", "act", "answer", "backtrack", "answer"]
    searches = [t["tool"] for t in trace if t["tool"]]
    assert searches[0]["result"].startswith("[P1] The secret code of the green door is 5120.")
    assert all(t["prefix_break"] is None for t in trace)
    assert backend.calls[0]["params"]["max_new_tokens"] == 0
    head = backend.calls[0]["prompt"]
    assert all(c["prompt"].startswith(head) for c in backend.calls)  # one byte-stable head
    assert all(c["params"]["temperature"] == 0.0 for c in backend.calls)
    summary = summarize(report)
    assert summary.accuracy == 1.0 and summary.answered == 2 and not summary.interrupted


def test_no_cache_sends_prefix_cache_false_on_every_request(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    backend = scripted(_answers)
    monkeypatch.setattr("tasks.backend_setup.open_backend", lambda spec: backend)
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC_TEXT, encoding="utf-8")
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"question": "What is the secret code of the green door?", "answer": "5120"}) + "\n"
    )
    out = tmp_path / "out"
    assert main(["--doc", str(doc), "--questions", str(questions), "--no-cache", "--out", str(out)]) == 0
    assert backend.calls and all(c["prefix_cache"] is False for c in backend.calls)
    assert "accuracy" in capsys.readouterr().out


def test_partial_run_keeps_answered_lines(tmp_path: Path) -> None:
    def stop_on_second(question: Question, step: Any) -> None:
        if question.id == "q2":
            raise KeyboardInterrupt

    report = run_qa(
        scripted(_answers), _doc(tmp_path), QUESTIONS, out_dir=tmp_path / "out", on_step=stop_on_second
    )
    assert report.interrupted
    lines = (tmp_path / "out" / "answers.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["q1"]


@pytest.mark.parametrize("opening", ['{"answer":"', '{"answer": "'])  # llguidance, SGLang's xgrammar
def test_answer_cut_by_max_new_tokens_is_salvaged(tmp_path: Path, opening: str) -> None:
    backend = scripted(lambda prompt: opening + "The secret code of the green door is 5120. Nobody else kn")
    report = run_qa(backend, _doc(tmp_path), QUESTIONS[:1], max_steps=3)
    (result,) = report.results
    assert result.status == "answered" and result.row["correct"] is True and result.row["steps"] == 1
    assert result.row["answer"] == "The secret code of the green door is 5120."


def _cli(tmp_path: Path, doc: str | None, questions: str | None, capsys: Any) -> tuple[int, str]:
    doc_path, q_path = tmp_path / "d.txt", tmp_path / "q.jsonl"
    if doc is not None:
        doc_path.write_text(doc, encoding="utf-8")
    if questions is not None:
        q_path.write_text(questions, encoding="utf-8")
    code = main(["--doc", str(doc_path), "--questions", str(q_path), "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err


def test_cli_bad_inputs_name_file_and_line(tmp_path: Path, capsys: Any) -> None:
    good_q = '{"question": "What?"}\n'
    code, err = _cli(tmp_path, None, good_q, capsys)
    assert code == 2 and "d.txt" in err and "not found" in err
    code, err = _cli(tmp_path, "  \n\n", good_q, capsys)
    assert code == 2 and "d.txt" in err and "empty" in err
    code, err = _cli(tmp_path, DOC_TEXT, good_q + '{"question": "broken"\n', capsys)
    assert code == 2 and "q.jsonl:2:" in err and "invalid JSON" in err


@pytest.mark.slow
def test_oversize_document_is_refused(tmp_path: Path, engine: Any) -> None:
    from runtime.backends.embedded import EmbeddedBackend

    long_doc = _doc(
        tmp_path, "\n".join(f"Line {i} says the weather was fine and the sea was calm." for i in range(1200))
    )
    with pytest.raises(TaskInputError, match=r"doc\.txt: document is \d+ tokens"):
        run_qa(EmbeddedBackend(engine), long_doc, QUESTIONS[:1])


def test_a_server_pool_smaller_than_the_head_is_refused_before_any_question(tmp_path: Path) -> None:
    """A real SGLang server refuses inputs past its `max_req_input_len` (run.sh's default 1,024-token
    pool is smaller than a longdoc head): the runner must say so, not score every question wrong."""

    class SmallServer(ReplyBackend):
        def server_info(self) -> dict[str, Any]:
            return {"max_total_num_tokens": 1024, "internal_states": [{"max_req_input_len": 1018}]}

    backend = SmallServer(lambda prompt, _params: _answers(prompt))
    assert context_limit(backend) == 1018 and context_limit(with_cache(backend, False)) == 1018
    doc = _doc(tmp_path, "\n".join(f"Line {i} says the sea was calm." for i in range(60)))
    with pytest.raises(TaskInputError, match=r"doc\.txt: document is \d+ tokens"):
        run_qa(backend, doc, QUESTIONS[:1])
    assert backend.calls == []


@pytest.mark.slow
def test_qa_end_to_end_on_the_engine(tmp_path: Path, engine: Any) -> None:
    from runtime.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(engine)
    report = run_qa(backend, _doc(tmp_path), QUESTIONS, out_dir=tmp_path / "out", max_steps=1)
    assert report.prefill is not None
    head_tokens = report.prefill.prompt_tokens
    # The leader computes the new document itself (the shared engine may hold a chat header).
    assert report.prefill.cached_tokens < 32 < head_tokens
    rows = [json.loads(line) for line in (tmp_path / "out" / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("correct" in r for r in rows)
    for result in report.results:  # every question's first call reuses the whole prefilled head
        assert result.records[0].cached_tokens >= head_tokens - 1
        assert all(r.prefix_break is None for r in result.records)
    summary = summarize(report)
    assert summary.hit_rate > 0.5 and summary.fidelity >= 0.99
    trace = (tmp_path / "out" / "trace.jsonl").read_text().splitlines()
    assert len(trace) == len(report.records)
    engine.check_integrity()


@pytest.mark.slow
def test_demo_prints_steps_and_summary(tmp_path: Path, engine: Any, monkeypatch: Any, capsys: Any) -> None:
    from runtime.backends.embedded import EmbeddedBackend
    from tasks import demo

    monkeypatch.setattr("tasks.backend_setup.open_backend", lambda spec: EmbeddedBackend(engine))
    monkeypatch.setattr(demo, "DEMO_DOC", "needle/doc_1024_0.txt")
    monkeypatch.setattr(demo, "DEMO_QUESTIONS", "needle/questions_1024_0.jsonl")
    assert demo.main(["--questions", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "cached" in out and "TTFT" in out and "summary" in out
    assert (tmp_path / "answers.jsonl").read_text().count("\n") == 1


def test_longdoc_suite_passes_ctrl_c_on_to_the_eval() -> None:
    """The QA pass keeps its partial answers on Ctrl-C, but a suite inside `radixagent eval` must
    stop the whole eval (it used to swallow the interrupt and go on with the next mode)."""
    from tasks.outcomes import SuiteOptions
    from tasks.qa import run_longdoc_suite

    def reply(prompt: str) -> str:
        raise KeyboardInterrupt

    backend = scripted(reply)
    with pytest.raises(KeyboardInterrupt):
        run_longdoc_suite(backend, SuiteOptions(limit=2))
    assert backend.calls
