"""`--reasoning-parser` and `--reasoning-history` on a tiny Qwen3 (tests/families.py, Qwen3's
chat template): reasoning apart from content (whole, streamed, raw on request, before a tool
call), a turn sent back with its reasoning reused whole, and the template's own rendering
named in the trace as `template_rewrite`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from runtime import Engine
from runtime.server import ServerArgs, create_app
from runtime.server.ready import NotReady, wait_ready
from tests.families import build_family
from tests.support.server_util import LiveServer

pytestmark = pytest.mark.slow  # the bundled tokenizer; one test starts `radixagent serve`

FORCED = "<think>plan</think>Hello"
SYSTEM = "You are a planner. " + " ".join(f"Step {i}: think, then answer." for i in range(12))
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return build_family(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="module")
def engine(qwen3):
    eng = Engine(model_path=str(qwen3), max_total_tokens=8192)
    yield eng
    eng.shutdown()


def _chat(url: str, messages: list, **extra) -> dict:
    body = {"model": "m", "messages": messages, "temperature": 0, "max_tokens": 24, **extra}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _turn2(first: dict, reasoning: bool = True) -> list:
    msg = first["choices"][0]["message"]
    back = {"role": "assistant", "content": msg["content"]}
    if reasoning:
        back["reasoning_content"] = msg["reasoning_content"]
    return [*FIRST, back, {"role": "user", "content": "And now goodbye?"}]


def _serve(args: ServerArgs, engine: Engine) -> LiveServer:
    engine.flush_cache()
    return LiveServer(create_app(engine, args))


def test_cli_serve_splits_reasoning_and_reuses_the_turn(qwen3, tmp_path):
    """The issue's must-show, through `radixagent serve` itself."""
    port = _free_port()
    cmd = [sys.executable, "-m", "runtime.cli", "serve", "--model-path", str(qwen3), "--port", str(port)]
    cmd += ["--reasoning-parser", "qwen3", "--max-total-tokens", "4096", "--trace-dir", str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        first = _chat(url, FIRST, regex=FORCED, prompt_cache_key="s")
        msg = first["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == ("plan", "Hello")
        second = _chat(url, _turn2(first), max_tokens=2, prompt_cache_key="s")
        used = first["usage"]
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= used["prompt_tokens"] + used["completion_tokens"] - 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_template_history_is_named_in_the_trace(engine, tmp_path):
    args = ServerArgs(reasoning_parser="qwen3", reasoning_history="template", trace_dir=str(tmp_path))
    with _serve(args, engine) as live:
        first = _chat(live.url, FIRST, regex=FORCED, prompt_cache_key="t")
        second = _chat(live.url, _turn2(first), max_tokens=2, prompt_cache_key="t")
    used = first["usage"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Qwen3's template dropped turn 1's <think> block: the reuse stops at its assistant header
    assert cached <= used["prompt_tokens"] < used["prompt_tokens"] + used["completion_tokens"] - 2
    steps = [json.loads(line) for line in (tmp_path / "default.jsonl").read_text().splitlines()]
    step = steps[1]
    assert step["miss"].get("template_rewrite", 0) > 0 and "prompt_change" not in step["miss"]
    assert sum(step["miss"].values()) == step["prompt_tokens"] - step["cached_tokens"]
    brk = step["prefix_break"]
    assert brk["cause"] == "template_rewrite"
    assert brk["rewrites"] == [{"message": 2, "dropped": "<think>plan</think>"}]


def test_preserve_reuses_turns_sent_back_in_any_form(engine, tmp_path):
    args = ServerArgs(reasoning_parser="qwen3", trace_dir=str(tmp_path))
    with _serve(args, engine) as live:
        first = _chat(live.url, FIRST, regex=FORCED, prompt_cache_key="p")
        need = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 2
        second = _chat(live.url, _turn2(first), max_tokens=2)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= need
        # a client that drops the reasoning changed the history: rendered as sent, not restored
        dropped = _chat(live.url, _turn2(first, reasoning=False), max_tokens=2)
        assert dropped["usage"]["prompt_tokens_details"]["cached_tokens"] < need
        raw = _chat(live.url, FIRST, regex=FORCED, separate_reasoning=False)
        assert raw["choices"][0]["message"]["content"] == FORCED
        assert raw["choices"][0]["message"].get("reasoning_content") is None
        back = [*FIRST, {"role": "assistant", "content": FORCED}, {"role": "user", "content": "Bye?"}]
        again = _chat(live.url, back, max_tokens=2)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= need
    steps = [json.loads(line) for line in (tmp_path / "default.jsonl").read_text().splitlines()]
    assert steps[0]["miss"] == {"new": steps[0]["prompt_tokens"]}


def test_turns_are_remembered_per_cache_salt(engine):
    """Another tenant sending the same turn back gets the template's rendering, not this one's
    generated text and tokens."""
    with _serve(ServerArgs(reasoning_parser="qwen3"), engine) as live:
        first = _chat(live.url, FIRST, regex=FORCED, cache_salt="a")
        own = _chat(live.url, _turn2(first), max_tokens=1, cache_salt="a")
        other = _chat(live.url, _turn2(first), max_tokens=1, cache_salt="b")
    assert own["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # Qwen3's template drops the thinking block of a turn it renders itself
    assert other["usage"]["prompt_tokens"] < own["usage"]["prompt_tokens"]


def test_streamed_reasoning_content(engine):
    with _serve(ServerArgs(reasoning_parser="qwen3"), engine) as live:
        body = {
            "model": "m",
            "messages": FIRST,
            "temperature": 0,
            "max_tokens": 24,
            "regex": FORCED,
            "stream": True,
        }
        parts = {"reasoning_content": "", "content": ""}
        with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
                for key in parts:
                    parts[key] += delta.get(key) or ""
    assert parts == {"reasoning_content": "plan", "content": "Hello"}


def test_thinking_then_a_tool_call(engine):
    """The tool grammar lets the model think first; biases make it open and close the block."""
    tok = engine.tokenizer
    think, end = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"enum": ["a", "b"]}}, "required": ["q"]},
        },
    }
    extra = dict(
        tools=[tool], tool_choice="required", logit_bias={str(think): 50, str(end): 100}, max_tokens=40
    )
    with _serve(ServerArgs(reasoning_parser="qwen3"), engine) as live:
        first = _chat(live.url, FIRST, **extra)
        choice = first["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["reasoning_content"] == ""
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"])["q"] in "ab"
        back = {"role": "assistant", "content": None, "reasoning_content": "", "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": call["id"], "content": "found"}
        second = _chat(live.url, [*FIRST, back, result], tools=[tool], max_tokens=2)
    need = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 2
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= need


def test_streamed_tool_call_after_thinking(engine):
    tok = engine.tokenizer
    think, end = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    body = {"model": "m", "messages": FIRST, "temperature": 0, "max_tokens": 40, "stream": True}
    body |= {"tools": [tool], "tool_choice": "required", "logit_bias": {str(think): 50, str(end): 100}}
    names, reasons, content = [], [], ""
    with (
        _serve(ServerArgs(reasoning_parser="qwen3"), engine) as live,
        httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, timeout=120) as r,
    ):
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if not choices:
                continue
            delta = choices[0]["delta"]
            content += delta.get("content") or ""
            names += [c["function"]["name"] for c in delta.get("tool_calls") or [] if "name" in c["function"]]
            reasons.append(choices[0]["finish_reason"])
    assert names == ["lookup"] and reasons[-1] == "tool_calls"
    assert "<think>" not in content and "<tool_call>" not in content


def test_enable_thinking_false_closes_the_block_in_the_prompt(engine):
    with _serve(ServerArgs(reasoning_parser="qwen3"), engine) as live:
        out = _chat(live.url, FIRST, regex="Hello", chat_template_kwargs={"enable_thinking": False})
    msg = out["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (None, "Hello")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    try:
        wait_ready(url, proc, timeout_s=120)
    except NotReady as exc:
        raise AssertionError(f"{exc}: {proc.stderr.read() if proc.stderr else ''}") from None
