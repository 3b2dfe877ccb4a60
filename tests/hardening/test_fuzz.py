"""Hostile input against a live server: schemathesis over the published OpenAPI schema, then
hand-written cases (malformed and truncated JSON, wrong types, huge strings, deep nesting, invalid
UTF-8, NUL bytes, lone surrogates, extreme numbers, unknown sessions, mismatched batches, prompts at
and one past the context limit).

Every answer must be < 500 and every error must have the `{"error": {"message", "type"}}` shape;
after the run the server is healthy and the engine's integrity check holds. Requests that reach the
model are capped at 2 new tokens. RADIXAGENT_FUZZ_LONG=1 runs ~10x more schema examples, randomized.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from conftest import CONTEXT

# schemathesis and hypothesis are imported where they are used: ~1.5 s that the fast suite
# (one test here) would pay at collection

LONG = os.environ.get("RADIXAGENT_FUZZ_LONG", "") not in ("", "0")
EXAMPLES = 250 if LONG else 20  # per operation and generation mode
MIN_REQUESTS = 1000
CAP = 2  # max new tokens for any request that reaches the model
TOKEN_FIELDS = ("max_new_tokens", "max_tokens", "max_completion_tokens")


@dataclass
class Tally:
    """Every fuzz request's status; 5xx answers with what caused them."""

    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    def record(self, r: httpx.Response | Any, what: str) -> None:
        self.statuses[r.status_code] += 1
        if r.status_code >= 500:
            self.server_errors.append(f"{r.status_code} {what}: {r.text[:300]}")
        elif r.status_code >= 400:
            body = r.json()
            assert set(body["error"]) >= {"message", "type"}, f"{what}: bad error shape {body}"

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


@pytest.fixture(scope="module")
def module_tally() -> Tally:
    return Tally()


@pytest.fixture()
def tally(module_tally: Tally) -> Iterator[Tally]:
    """Each test checks its own answers: run alone, it still fails on a 5xx (the last test
    checks the module's totals, health and integrity)."""
    seen = len(module_tally.server_errors)
    yield module_tally
    fresh = module_tally.server_errors[seen:]
    assert not fresh, "\n".join(fresh[:20])


@pytest.fixture(scope="module")
def client(fuzz_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def operations(fuzz_server: Any) -> list[Any]:
    """Every operation of the server's published OpenAPI schema."""
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def cheap(body: Any) -> Any:
    """Cap every token budget in a generated body at CAP (and set one where it is missing), so that
    accepted requests cost at most a short prefill and two decode steps."""
    if not isinstance(body, dict):
        return body
    for key in TOKEN_FIELDS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > CAP:
            body[key] = CAP
    if ("messages" in body or "prompt" in body) and body.get("max_tokens") is None:
        body["max_tokens"] = CAP
    if "text" in body or "input_ids" in body:
        params = body.get("sampling_params")
        if params is None:
            body["sampling_params"] = params = {}
        if isinstance(params, dict):
            cheap(params)
            if params.get("max_new_tokens") is None:
                params["max_new_tokens"] = CAP
    return body


@pytest.mark.parametrize("mode_name", ["positive", "negative"])  # schemathesis' GenerationMode values
def test_schema_fuzz(operations: list[Any], mode_name: str, tally: Tally) -> None:
    """EXAMPLES generated requests per operation (schemathesis strategies driven by hypothesis;
    schemathesis' own pytest plugin is not used: it does not run under pytest 9.2)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    mode = GenerationMode(mode_name)
    fuzz = settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not LONG,
        suppress_health_check=list(HealthCheck),
    )
    for operation in operations:

        @fuzz
        @given(case=operation.as_strategy(generation_mode=mode))
        def one(case: Any) -> None:
            case.body = cheap(case.body)
            response = case.call(timeout=120)
            tally.record(response, f"{case.method} {case.path} {str(case.body)[:200]}")
            assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:300]}"

        try:
            one()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body): positive mode covers it
            assert mode == GenerationMode.NEGATIVE, operation.label


# ---- hand-written cases ---------------------------------------------------------------------

GEN = {"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
WRONG = [None, True, 0, -1, 1.5, "s", "", [], {}, [1], ["a"], [[1]], {"a": 1}]


def _post(client: httpx.Client, tally: Tally, path: str, body: Any = None, raw: bytes | None = None) -> int:
    raw = json.dumps(body).encode() if raw is None else raw  # ASCII escapes: lone surrogates travel too
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    tally.record(r, f"POST {path} {raw[:200]!r}")
    return r.status_code


def test_malformed_and_truncated_json(client: httpx.Client, tally: Tally) -> None:
    bodies = [
        b"",
        b"{",
        b"}",
        b"null",
        b"[]",
        b'"text"',
        b"123",
        b"{'text': 'x'}",
        b'{"text": "x",}',
        b'{"text": "x"} trailing',
        b'{"text": "x" "y"}',
    ]
    valid = json.dumps(GEN).encode()
    bodies += [valid[:i] for i in range(1, len(valid))]  # every truncation
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/open_session", "/tokenize"):
        for raw in bodies:
            assert _post(client, tally, path, raw=raw) == 400, (path, raw)
        for raw in (b'{"text": NaN, "prompt": NaN}', b'{"text": 1e999, "prompt": -Infinity}'):
            _post(client, tally, path, raw=raw)  # not JSON; Python's parser reads them: any 4xx


def test_wrong_types(client: httpx.Client, tally: Tally) -> None:
    top = [
        "text",
        "input_ids",
        "stream",
        "rid",
        "session_params",
        "session_id",
        "cache_salt",
        "extra_key",
        "priority",
        "prefix_cache",
        "return_logprob",
        "sampling_params",
    ]
    inner = [
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "json_schema",
        "regex",
        "seed",
        "n",
        "logit_bias",
        "stop_regex",
    ]
    for name in top:
        for value in WRONG:
            if name == "sampling_params" and (value is None or isinstance(value, dict)):
                continue  # None or {} would mean the default token budget
            _post(client, tally, "/generate", {**GEN, name: value})
    for name in inner:
        for value in WRONG:
            if name == "max_new_tokens" and (value is None or type(value) is int):
                continue  # None means the default budget; ints are valid
            _post(
                client,
                tally,
                "/generate",
                {**GEN, "sampling_params": {**GEN["sampling_params"], name: value}},
            )
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for name in [
        "messages",
        "model",
        "temperature",
        "n",
        "stop",
        "stream",
        "stream_options",
        "response_format",
        "cache_salt",
        "logprobs",
        "tools",
        "tool_choice",
        "seed",
    ]:
        for value in WRONG:
            _post(client, tally, "/v1/chat/completions", {**chat, name: value})
    for value in WRONG:
        msg = {"role": "assistant", "content": "x", "tool_calls": value, "name": value}
        _post(client, tally, "/v1/chat/completions", {**chat, "messages": [msg, *chat["messages"]]})
        _post(client, tally, "/v1/completions", {"prompt": value, "max_tokens": 1})
        _post(
            client, tally, "/session_event", {"session_id": "fz", "event": "tool_wait", "expected_s": value}
        )
        _post(client, tally, "/detokenize", {"tokens": value})


def test_huge_strings_nul_bytes_and_bad_unicode(client: httpx.Client, tally: Tally) -> None:
    big = "x" * 1_000_000
    for name in ("text", "cache_salt", "rid", "session_id", "extra_key"):
        assert _post(client, tally, "/generate", {**GEN, name: big}) < 500
    for name in ("stop", "json_schema", "regex"):
        _post(
            client, tally, "/generate", {**GEN, "sampling_params": {"max_new_tokens": 1, name: big[:100_000]}}
        )
    for regex in ("(a*)*b", "a{100000}", "[", "(?P<x>a)(?P=x)", "\\", "a{2,1}", "(((((((((a)))))))))*"):
        _post(client, tally, "/generate", {**GEN, "sampling_params": {"max_new_tokens": 1, "regex": regex}})
    for text in ("a\x00b", "\x00", "\ud800", "x\udfff", "\uffff", "\U0010ffff", "\u202e"):
        for name in ("text", "cache_salt", "rid", "session_id"):
            _post(client, tally, "/generate", {**GEN, name: text})
        _post(
            client,
            tally,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "rid": text},
        )
        _post(client, tally, "/tokenize", {"prompt": text})
    for raw in (
        b'{"text": "\xff\xfe"}',
        b'{"text": "\xc3"}',
        b"\xef\xbb\xbf" + json.dumps(GEN).encode(),
        b'{"text": "a\x00b"}',
        b"\x00" * 64,
        json.dumps(GEN).encode("utf-16"),
    ):
        _post(client, tally, "/generate", raw=raw)


def test_deep_nesting(client: httpx.Client, tally: Tally) -> None:
    for depth in (100, 1_000, 100_000):
        nested = "[" * depth + "]" * depth
        assert _post(client, tally, "/generate", raw=f'{{"text": {nested}}}'.encode()) == 400
        obj = '{"a":' * depth + "1" + "}" * depth
        _post(
            client,
            tally,
            "/generate",
            raw=f'{{"text": "x", "sampling_params": {{"max_new_tokens": 1}}, "session_params": {obj}}}'.encode(),
        )
        _post(
            client,
            tally,
            "/v1/chat/completions",
            raw=f'{{"messages": [{{"role": "user", "content": "x", "extra": {obj}}}], "max_tokens": 1}}'.encode(),
        )


def test_extreme_numbers(client: httpx.Client, tally: Tally) -> None:
    long_ids = [1] * (CONTEXT - 1 - CAP)  # leaves room for CAP tokens whatever max_new_tokens says
    huge = [10**30, -(10**30), 2**63, 2**64, -1, -(2**63) - 1, 1e308, -1e308, 1e-320, 5e-324, -0.0]
    for name in (
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "sampling_seed",
        "min_new_tokens",
        "n",
    ):
        for value in huge:
            params = {"max_new_tokens": CAP, "temperature": 0.7, name: value}
            _post(client, tally, "/generate", {"input_ids": long_ids, "sampling_params": params})
    for value in huge:
        _post(client, tally, "/generate", {**GEN, "priority": value})
        _post(
            client,
            tally,
            "/generate",
            {**GEN, "sampling_params": {"max_new_tokens": 1, "stop_token_ids": [value]}},
        )
        _post(client, tally, "/generate", {"input_ids": [value], "sampling_params": {"max_new_tokens": 1}})
        _post(client, tally, "/v1/completions", {"prompt": long_ids, "max_tokens": value, "seed": value})
        _post(client, tally, "/v1/completions", {"prompt": "x", "max_tokens": 1, "n": value})
        _post(
            client,
            tally,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
                "temperature": value,
                "top_p": value,
            },
        )
        _post(client, tally, "/detokenize", {"tokens": [value]})
        _post(client, tally, "/open_session", {"capacity_of_str_len": value})
        _post(
            client,
            tally,
            "/session_event",
            {"session_id": "fz-num", "event": "tool_wait", "expected_s": value},
        )
        _post(client, tally, "/session_event", {"session_id": "fz-num", "event": "abandon", "keep": value})
    for raw in (
        b'{"text": "x", "sampling_params": {"max_new_tokens": 1, "temperature": Infinity}}',
        b'{"text": "x", "sampling_params": {"max_new_tokens": 1, "temperature": NaN}}',
        b'{"text": "x", "sampling_params": {"max_new_tokens": 1, "top_p": NaN}}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "temperature": -Infinity}',
        b'{"text": "x", "sampling_params": {"max_new_tokens": 1, "temperature": 1e-45}}',
    ):
        _post(client, tally, "/generate", raw=raw)
        _post(client, tally, "/v1/chat/completions", raw=raw)


def test_unknown_sessions(client: httpx.Client, tally: Tally) -> None:
    for sid in ("never-opened", "", "y" * 10_000, "\x00never"):
        assert _post(client, tally, "/generate", {**GEN, "session_params": {"id": sid}}) in (200, 400)
        # SGLang's contract: closing what is not open is a no-op 200 (ids outside 1..256 chars: 400)
        assert _post(client, tally, "/close_session", {"session_id": sid}) == (
            400 if not 0 < len(sid) <= 256 else 200
        )
        for event in ("tool_wait", "resume", "abandon", "close"):
            assert _post(client, tally, "/session_event", {"session_id": sid, "event": event}) == 400
    assert _post(client, tally, "/generate", {**GEN, "session_params": {"id": 5}}) == 400
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "session_params": {"id": "nope"}}
    assert _post(client, tally, "/v1/chat/completions", chat) == 400


def test_mismatched_batches(client: httpx.Client, tally: Tally) -> None:
    one = {"max_new_tokens": 1}
    cases = [
        {"text": ["a", "b"], "rid": ["x"], "sampling_params": one},
        {"text": ["a"], "rid": ["x", "y", "z"], "sampling_params": one},
        {"input_ids": [[1], [2]], "rid": ["x"], "sampling_params": one},
        {"input_ids": [[1], 2], "sampling_params": one},
        {"input_ids": [[1], []], "sampling_params": one},
        {"input_ids": [[]], "sampling_params": one},
        {"text": [], "sampling_params": one},
        {"text": ["a", 1], "sampling_params": one},
        {"text": ["a", "b"], "stream": True, "sampling_params": one},
        {"text": ["a", "b"], "rid": ["x", "x"], "sampling_params": one},  # duplicate ids
        {"text": "a", "input_ids": [1], "sampling_params": one},
    ]
    for body in cases:
        _post(client, tally, "/generate", body)
    for body in (
        {"prompt": [[1], "a"], "max_tokens": 1},
        {"prompt": [], "max_tokens": 1},
        {"prompt": [[]], "max_tokens": 1},
        {"prompt": ["a", "b"], "stream": True, "max_tokens": 1},
        {"prompt": "a", "n": 2, "stream": True, "max_tokens": 1},
    ):
        _post(client, tally, "/v1/completions", body)


def test_prompts_at_and_past_the_context_limit(client: httpx.Client, tally: Tally, small_engine: Any) -> None:
    limit = CONTEXT - 1  # the last position is the first new token's
    for n, expected in ((limit, 200), (limit + 1, 400), (CONTEXT * 4, 400)):
        ids = [1] * n
        for stream in (False, True):
            # max_new_tokens unset: clamped to the room left (an explicit 10**9 is a 400: test_control.py)
            body = {"input_ids": ids, "stream": stream, "sampling_params": {"temperature": 0}}
            assert _post(client, tally, "/generate", body) == expected, (n, stream)
            assert (
                _post(client, tally, "/v1/completions", {"prompt": ids, "max_tokens": 1, "stream": stream})
                == expected
            )
        text = " ".join(["hello"] * n)
        assert len(small_engine.tokenize(text)) == n
        assert (
            _post(client, tally, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}})
            == expected
        )


def test_methods_and_paths(client: httpx.Client, tally: Tally) -> None:
    for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"):
        for path in (
            "/generate",
            "/v1/completions",
            "/v1/chat/completions",
            "/nope",
            "/v1/models/x%00y",
            "/debug/integrity",
            "/" + "a" * 5000,
        ):
            r = client.request(method, path)
            tally.statuses[r.status_code] += 1
            assert r.status_code < 500, (method, path, r.text[:200])
    r = client.post("/generate", content=json.dumps(GEN), headers={"content-type": "text/plain"})
    tally.record(r, "text/plain body")


def test_after_fuzz_server_is_healthy(client: httpx.Client, tally: Tally, small_engine: Any) -> None:
    """Runs last in this module: totals, health, integrity."""
    from tests.support.server_util import wait_idle

    wait_idle(small_engine)
    assert client.get("/health").status_code == 200
    report = client.get("/debug/integrity").json()
    assert report["ok"] and report["lock_refs"] == 0 and report["running"] == 0, report
    small_engine.check_integrity()
    r = client.post("/generate", json=GEN)
    assert r.status_code == 200, r.text
    print(f"\nfuzz: {tally.total} requests, statuses {dict(sorted(tally.statuses.items()))}")
    assert not tally.server_errors, "\n".join(tally.server_errors[:20])
    assert tally.total >= MIN_REQUESTS, dict(tally.statuses)


def test_tiny_temperature_samples_greedily() -> None:
    """Found by the fuzz: logits / 1e-320 is inf, softmax NaN, and the scheduler failed the batch."""
    import torch

    from runtime.engine.sampling import Sampler, SamplingParams

    logits = torch.tensor([0.5, 3.0, -1.0])
    for temperature in (1e-320, 5e-324, 1e-7):
        params = SamplingParams(temperature=temperature, seed=1)
        assert params.greedy and Sampler(params)(logits) == 1
