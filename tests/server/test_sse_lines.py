"""U+2028, U+2029 and U+0085 are line breaks to str.splitlines and to line readers built on it
(httpx's `iter_lines`), and JSON leaves them raw inside strings. Text holding one (generated or
echoed) must not cut an event, a trace record or a JSON-lines entry in two: the server escapes
them in its events, and our readers split lines only where their formats do."""

from __future__ import annotations

import json

import httpx
import pytest
from httpx._decoders import LineDecoder

from agent.trace import read_trace
from runtime.backends.sglang import _event_lines, _sse_events
from runtime.server.bridge import sse
from runtime.trace.record import StepRecord
from tasks.questions import dump_jsonl, load_questions
from tests.support.trace_records import step_dict

BREAKS = ["\u2028", "\u2029", "\x85"]
TEXT = "one\u2028two\u2029three\x85four é"


@pytest.mark.parametrize("brk", BREAKS)
def test_an_event_is_one_line_to_httpx_and_decodes_to_the_same_text(brk: str) -> None:
    body = {"text": f"a{brk}b", "meta_info": {"id": "x"}}
    decoder = LineDecoder()
    lines = [ln for ln in decoder.decode(sse(body).decode()) + decoder.flush() if ln]
    assert len(lines) == 1 and json.loads(lines[0].removeprefix("data: ")) == body


def test_an_echoed_prompt_with_line_breaks_streams_whole_to_an_httpx_reader(server) -> None:
    """The OpenAI completions door streams the prompt back (echo): read as httpx reads lines."""
    body = {"model": "m", "prompt": TEXT, "max_tokens": 2, "temperature": 0, "echo": True, "stream": True}
    text = ""
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    assert text.startswith(TEXT)


def test_the_sglang_client_reads_raw_line_breaks_in_events_cut_anywhere() -> None:
    """SGLang's server writes them raw (orjson): the client splits events at CR/LF only, also
    when a chunk ends inside a multi-byte character or between CR and LF."""
    raw = (
        b"".join(
            b"data: " + json.dumps({"text": t}, ensure_ascii=False).encode() + b"\r\n\r\n"
            for t in (TEXT, "x")
        )
        + b"data: [DONE]\n\n"
    )
    for size in (1, 2, 3, 7, len(raw)):
        chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert [e["text"] for e in _sse_events(_event_lines(chunks))] == [TEXT, "x"]


def test_a_trace_record_holding_line_breaks_reads_back(tmp_path) -> None:
    record = StepRecord.from_dict(step_dict(tool={"name": "read", "result": TEXT}))
    path = tmp_path / "trace.jsonl"
    path.write_text(record.to_json() + "\n" + record.to_json() + "\n", encoding="utf-8")
    assert [r.tool for r in read_trace(path)] == [{"name": "read", "result": TEXT}] * 2


def test_a_questions_file_with_line_breaks_in_a_string_loads(tmp_path) -> None:
    path = tmp_path / "q.jsonl"
    dump_jsonl(path, [{"id": "a", "question": f"what is {TEXT}?"}, {"id": "b", "question": "two?"}])
    assert [q.id for q in load_questions(path)] == ["a", "b"]
    assert load_questions(path)[0].question == f"what is {TEXT}?"
