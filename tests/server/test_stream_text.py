"""A character whose UTF-8 bytes span tokens (CJK, emoji: byte-level BPE splits them) decodes as
U+FFFD until its last byte arrives. Streamed text must never show that placeholder: clients append
the text past what they were sent, so a placeholder once sent would stand in for the character
for good (and hide it). Each streamed text is a prefix of the next and of the finished text."""

from __future__ import annotations

import json

import httpx
import pytest

#: characters of 3 and 4 UTF-8 bytes; the bundled tokenizer spells each in 2-3 tokens
TEXT = "日本語です😀"
PARAMS = {"temperature": 0, "max_new_tokens": 32, "regex": TEXT}


def _split_characters(engine, ids: list[int]) -> bool:
    """Whether some prefix of `ids` ends inside a character (the case under test happened)."""
    return any(engine.tokenizer.decode(ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))


def test_engine_streams_whole_characters_only(engine):
    chunks = list(engine.generate_stream(prompt="Say it:", sampling_params=PARAMS))
    final = chunks[-1]
    assert final["text"] == TEXT
    assert _split_characters(engine, final["output_ids"]), "no character spanned tokens: nothing tested"
    texts = [c["text"] for c in chunks]
    assert not any(t.endswith("\ufffd") for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_stream_deltas_add_up_to_the_text(server, engine, path):
    body: dict = {"model": "m", "temperature": 0, "max_tokens": 32, "regex": TEXT, "stream": True}
    body |= (
        {"messages": [{"role": "user", "content": "Say it."}]} if "chat" in path else {"prompt": "Say it:"}
    )
    pieces = []
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line.removeprefix("data: ")).get("choices", []):
                pieces.append(choice["delta"].get("content") or "" if "chat" in path else choice["text"])
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == TEXT


def test_responses_stream_deltas_add_up_to_the_text(server):
    body = {
        "model": "m",
        "input": "Say it.",
        "temperature": 0,
        "max_output_tokens": 32,
        "regex": TEXT,
        "stream": True,
    }
    deltas, done = [], None
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "response.output_text.delta":
                deltas.append(event["delta"])
            elif event["type"] == "response.output_text.done":
                done = event["text"]
    assert "".join(deltas) == done == TEXT
