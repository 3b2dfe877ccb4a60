"""`serve --trace-dir` (issue 19): the SDK's per-step trace for any client naming its session.

The unit half drives `TraceDir` with SGLang-shaped outputs (no model): files per salt, rotation,
unnamed requests untraced. The live half runs the real server with the `openai` client.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.engine.generation import GenerationRequest
from runtime.server.trace_dir import TRACE_SESSION, TraceDir, TraceDirConfig
from runtime.server.trace_files import FileBounds
from runtime.trace.record import StepRecord


def out(prompt: int, cached: int, evicted: int = 0, ids: list[int] | None = None) -> dict:
    meta = {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "evicted_prefix_tokens": evicted,
        "prefix_cache": True,
        "finish_reason": {"type": "length", "length": 1},
        "ttft": 0.1,
        "e2e_latency": 0.2,
    }
    return {"text": "x", "output_ids": ids if ids is not None else [7], "meta_info": meta}


def lines(path: Path) -> list[StepRecord]:
    return [StepRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines()]


def test_sessions_salts_and_unnamed(tmp_path: Path) -> None:
    trace = TraceDir(TraceDirConfig(tmp_path), tokenize=lambda text: [ord(c) for c in text])
    p1 = list(range(10, 30))
    trace.observe([GenerationRequest(input_ids=tuple(p1), session_id="a")], [out(20, 0)])
    trace.observe([GenerationRequest(input_ids=(*p1, 7, 1, 2), session_id="a")], [out(23, 20)])
    unnamed = GenerationRequest(input_ids=tuple(p1), cache_salt="tenant")
    trace.observe([unnamed], [out(20, 0)])  # not traced
    token = TRACE_SESSION.set("b")  # what the header middleware / prompt_cache_key do
    try:
        trace.observe([GenerationRequest(prompt="hello", cache_salt="tenant")], [out(5, 0)])
    finally:
        TRACE_SESSION.reset(token)
    trace.close()
    default, tenant = trace.path("default"), sorted(tmp_path.glob("*.jsonl"))
    steps = lines(default)
    assert [r.step for r in steps] == [0, 1]
    assert steps[0].miss == {"new": 20}
    assert steps[1].miss == {"last_token": 1, "new": 2} and steps[1].ideal_cached_tokens == 21
    other = [p for p in tenant if p != default]
    assert len(other) == 1 and "tenant" not in other[0].name  # a digest, never the salt
    assert [r.session_id for r in lines(other[0])] == ["b"]


def test_rotation_bounds_the_files(tmp_path: Path) -> None:
    trace = TraceDir(TraceDirConfig(tmp_path, FileBounds(max_bytes=4096, keep=2)), tokenize=list)
    for i in range(60):
        trace.observe([GenerationRequest(input_ids=(i + 1,) * 5, session_id=f"s{i}")], [out(5, 0)])
    trace.close()
    names = {p.name for p in tmp_path.iterdir()}
    # the live file (absent right after a rotation) and `keep` rotated ones, the oldest dropped
    assert (
        {"default.jsonl.1", "default.jsonl.2"}
        <= names
        <= {"default.jsonl", "default.jsonl.1", "default.jsonl.2"}
    )
    assert all(p.stat().st_size < 4096 + 1024 for p in tmp_path.iterdir())


def test_config_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        FileBounds(max_bytes=10)
    with pytest.raises(ValueError):
        TraceDirConfig(tmp_path, max_session_tokens=10, max_ledger_tokens=5)


@pytest.mark.slow
def test_openai_client_gets_the_trace(engine: object, tmp_path: Path) -> None:
    """Three ways of naming a session; a prompt change is found at its exact token offset."""
    import openai

    from runtime.server import ServerArgs, create_app
    from tests.support.server_util import LiveServer

    with LiveServer(create_app(engine, ServerArgs(trace_dir=str(tmp_path)))) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        head = list(range(2000, 2040))
        prompts = [head, head + [3000, 3001], head[:10] + [3999] + head[11:] + [3000, 3001, 3002]]
        namings = [
            {"extra_body": {"prompt_cache_key": "k"}},
            {"extra_headers": {"X-Session-Id": "k"}},
            {"extra_body": {"session_id": "k"}},
        ]
        for ids, naming in zip(prompts, namings, strict=True):
            client.completions.create(model="default", prompt=ids, max_tokens=0, **naming)
        client.completions.create(model="default", prompt=head, max_tokens=0)  # unnamed
    steps = lines(tmp_path / "default.jsonl")
    assert [r.session_id for r in steps] == ["k", "k", "k"]
    assert steps[1].miss == {"new": 2} and steps[1].cached_tokens == 40
    assert steps[2].prefix_break is not None and steps[2].prefix_break["offset"] == 10
    assert steps[2].cached_tokens == 10
    assert steps[2].miss == {"prompt_change": 32, "new": 1}
    for r in steps:
        assert sum(r.miss.values()) == r.prompt_tokens - r.cached_tokens


@pytest.mark.slow
def test_a_per_request_header_is_named_on_every_turn(engine: object, tmp_path: Path) -> None:
    """Issue 35: a client that puts a per-request value (a hash) at the start of its system
    prompt misses the cache on every turn. The trace names it: `prompt_change` at the same
    offset on every turn, with the changing span; the Messages door's conversations
    (`metadata.user_id`) are traced the same way."""
    import anthropic
    import openai

    from agent.trace_cli import cause_sentence
    from runtime.server import ServerArgs, create_app
    from tests.support.server_util import LiveServer

    rules = " ".join(f"Rule {i}: answer in at most {i + 3} words." for i in range(12))
    with LiveServer(create_app(engine, ServerArgs(trace_dir=str(tmp_path)))) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        claude = anthropic.Anthropic(base_url=live.url, api_key="none", max_retries=0)
        history: list[dict] = []
        for turn in range(3):
            system = f"x-request-hash: {turn * 7919:08x}. {rules}"
            history.append({"role": "user", "content": f"Say a word about the number {turn}."})
            for door in ("chat", "messages"):
                if door == "chat":
                    r = client.chat.completions.create(
                        model="default",
                        messages=[{"role": "system", "content": system}, *history],
                        max_tokens=4,
                        temperature=0,
                        extra_body={"prompt_cache_key": "hdr-chat"},
                    )
                    answer = r.choices[0].message.content or ""
                else:
                    claude.messages.create(
                        model="default",
                        system=system,
                        messages=history,
                        max_tokens=4,
                        metadata={"user_id": "hdr-messages"},
                    )
            history.append({"role": "assistant", "content": answer})
    # the Messages door keeps each API key's cache apart: its trace is in that tenant's file
    steps = [r for f in sorted(tmp_path.glob("*.jsonl")) for r in lines(f)]
    for session in ("hdr-chat", "hdr-messages"):
        mine = [r for r in steps if r.session_id == session]
        assert len(mine) == 3
        later = mine[1:]
        offsets = {r.prefix_break["offset"] for r in later if r.prefix_break}
        assert len(offsets) == 1 and len(later) == 2, [r.prefix_break for r in later]
        for r in later:
            changed = r.prefix_break["changed"]
            assert changed["realigned"] > 100 and "Rule 0" not in changed["got"]
            assert r.miss["prompt_change"] >= changed["realigned"], r.miss
            assert sum(r.miss.values()) == r.prompt_tokens - r.cached_tokens
        assert "the same offset" in cause_sentence(later)
