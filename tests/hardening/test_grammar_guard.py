"""Class 1 (issue 17): a user grammar can never take the server down. Bounds are checked before
llguidance compiles (400 naming the limit), compilation runs on a big stack, and a regex too large
for llguidance's lexer is refused before generation, without grammar internals in the message."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from guarded import GuardedServer

from runtime.engine.grammar_guard import (
    MAX_GRAMMAR_CHARS,
    MAX_REGEX_EXPANSION,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_REFS,
    check_json_schema,
    check_regex,
    regex_expansion,
)
from runtime.errors import GrammarError
from runtime.server import ServerArgs

ROOT = Path(__file__).resolve().parents[2]


def ref_chain(n: int) -> dict[str, Any]:
    """d0 -> d1 -> ... -> dn (a string): each hop one level of native recursion in llguidance."""
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def nested(n: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        schema = {"type": "array", "items": schema}
    return schema


TREE = {  # recursion through structure is legitimate and stays accepted
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}


# ---- the checks themselves (no model) ---------------------------------------------------------


def test_regex_expansion_multiplies_nested_repetitions() -> None:
    assert regex_expansion("[a-z]+") == 1
    assert regex_expansion(r"\d{3}-\d{4}") == 8
    assert regex_expansion("a{1000}{1000}") == 1_000_000
    assert regex_expansion("(a{100}){100}{100}") == 1_000_000
    assert regex_expansion("(ab|cd){3}") == 12
    check_regex("[a-z]{1,64}")
    for bad in ("a{1000}{1000}", "(x{200}){200}", "[a-z]{20000}"):
        with pytest.raises(GrammarError, match=f"limit is {MAX_REGEX_EXPANSION:,}"):
            check_regex(bad)


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        (json.dumps(ref_chain(2500)), f"characters; the limit is {MAX_GRAMMAR_CHARS}"),  # the example
        (json.dumps(ref_chain(1500)), f"more than {MAX_SCHEMA_REFS} distinct \\$ref"),
        (json.dumps(ref_chain(MAX_SCHEMA_REFS + 1)), "distinct \\$ref"),
        (json.dumps(nested(MAX_SCHEMA_DEPTH)), f"deeper than {MAX_SCHEMA_DEPTH}"),
        ("[" * 50_000 + "]" * 50_000, "characters; the limit"),
        ("[" * 30_000 + "]" * 30_000, f"deeper than {MAX_SCHEMA_DEPTH}"),
        ("5", "must be an object or a boolean, got a number"),
        ('"x"', "got a string"),
        ("[{}]", "got an array"),
        ("{", "not valid JSON"),
        (json.dumps({"type": "string", "pattern": "a{1000}{1000}"}), "pattern.*too large"),
        (json.dumps({"type": "string", "description": "x" * MAX_GRAMMAR_CHARS}), "characters"),
    ],
)
def test_schema_bounds(schema: str, needle: str) -> None:
    with pytest.raises(GrammarError, match=needle):
        check_json_schema(schema)


def test_legitimate_schemas_pass() -> None:
    for schema in (TREE, True, ref_chain(50), nested(MAX_SCHEMA_DEPTH // 2 - 1), {"type": "object"}):
        check_json_schema(json.dumps(schema))


def _compile_in_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def worst_within_bounds() -> str:
    """~6,000 native recursion levels in under 64 KB: 150 `$ref` hops, each under 40 `items`."""
    defs: dict[str, Any] = {}
    for i in range(150):
        node: dict[str, Any] = {"$ref": f"#/$defs/{i + 1}"}
        for _ in range(40):
            node = {"items": node}
        defs[str(i)] = node
    defs["150"] = {"type": "string"}
    return json.dumps({"$defs": defs, "$ref": "#/$defs/0"}, separators=(",", ":"))


def test_compilation_runs_on_a_stack_deeper_than_the_bounds() -> None:
    """The measurement behind COMPILE_STACK_BYTES, in child processes (a crash must not take pytest):
    the worst schema the bounds let through kills a process compiling it on an 8 MiB thread stack,
    and compiles on ours."""
    schema = worst_within_bounds()
    check_json_schema(schema)  # passes every bound
    prelude = textwrap.dedent(f"""
        import threading, llguidance
        from runtime.engine.grammar_guard import run_with_big_stack
        SCHEMA = {schema!r}
        def compile():
            grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
            llguidance.LLMatcher.validate_grammar(grammar)  # the native compile (lazy until here)
            return grammar
    """)
    ours = _compile_in_child(prelude + "\nprint(len(run_with_big_stack(compile)) > 0)")
    assert ours.returncode == 0 and ours.stdout.strip() == "True", ours.stderr[-500:]
    default = _compile_in_child(
        prelude
        + "\nthreading.stack_size(8 * 2**20)\nt = threading.Thread(target=compile)\nt.start(); t.join()"
    )
    assert default.returncode == -11  # SIGSEGV: what the bounds and the big stack protect the server from


@pytest.mark.slow
def test_worst_schema_within_bounds_compiles_in_the_server(small_engine: Any) -> None:
    from runtime.engine.grammar import GrammarMatcher

    assert GrammarMatcher.compile(small_engine.tokenizer, json_schema=worst_within_bounds()) is not None


# ---- over HTTP -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(small_engine: object) -> Iterator[httpx.Client]:
    with GuardedServer(small_engine, ServerArgs()) as live, httpx.Client(base_url=live.url, timeout=120) as c:
        yield c


def _gen(sampling: dict[str, Any]) -> dict[str, Any]:
    return {"text": "Give me JSON.", "sampling_params": {"max_new_tokens": 4, "temperature": 0, **sampling}}


def _chat(**extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "JSON please"}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }


def _completion(**extra: Any) -> dict[str, Any]:
    return {"prompt": "JSON please", "max_tokens": 4, "temperature": 0, **extra}


def _rf(schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def _assert_400(r: httpx.Response, *needles: str) -> str:
    assert r.status_code == 400, r.text[:400]
    message = r.json()["error"]["message"]
    for needle in needles:
        assert needle in message, message
    assert "<state>" not in message and "Parser" not in message, message  # no grammar internals
    assert r.headers.get("connection") != "close"  # a client mistake keeps the connection
    return message


def _alive(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    assert client.post("/generate", json=_gen({"max_new_tokens": 1})).status_code == 200


@pytest.mark.slow
def test_ref_chain_is_a_400_and_the_server_lives(client: httpx.Client) -> None:
    example = json.dumps(ref_chain(2500))  # the example: ~80 KB, killed the process
    _assert_400(client.post("/generate", json=_gen({"json_schema": example})), "json_schema", "limit is")
    chain = json.dumps(ref_chain(1500))  # under the size limit: the $ref bound answers
    _assert_400(client.post("/generate", json=_gen({"json_schema": chain})), "json_schema", "$ref")
    _alive(client)
    _assert_400(client.post("/v1/completions", json=_completion(json_schema=chain)), "$ref")
    _assert_400(
        client.post("/v1/chat/completions", json=_chat(**_rf(ref_chain(1500)))),
        "response_format.json_schema.schema",
        "$ref",
    )
    _assert_400(client.post("/v1/completions", json=_completion(**_rf(nested(80)))), "deeper than")
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert client.post("/generate", json=_gen({"json_schema": json.dumps(cycle)})).status_code < 500
    _alive(client)


@pytest.mark.slow
def test_legitimate_schemas_still_constrain(client: httpx.Client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = client.post("/generate", json=_gen({"json_schema": json.dumps(schema), "max_new_tokens": 12}))
    assert r.status_code == 200 and r.json()["text"].startswith('{"a":'), r.text
    assert client.post("/v1/chat/completions", json=_chat(**_rf(TREE))).status_code == 200
    assert client.post("/generate", json=_gen({"json_schema": json.dumps(ref_chain(100))})).status_code == 200


@pytest.mark.slow
def test_regex_too_large_is_refused_before_generation(client: httpx.Client, small_engine: Any) -> None:
    before = small_engine.get_cache_stats()["prompt_tokens"]
    _assert_400(client.post("/generate", json=_gen({"regex": "a{1000}{1000}"})), "regex", "too large")
    _assert_400(client.post("/v1/chat/completions", json=_chat(regex="(a{100}){100}{100}")), "regex")
    pattern = json.dumps({"type": "string", "pattern": "(b{300}){300}"})
    _assert_400(client.post("/v1/completions", json=_completion(json_schema=pattern)), "pattern", "too large")
    assert small_engine.get_cache_stats()["prompt_tokens"] == before  # nothing was prefilled
    assert client.post("/generate", json=_gen({"regex": "[0-9]{3}"})).json()["text"].isdigit()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_response_format_without_schema_is_a_400(client: httpx.Client, path: str) -> None:
    body = _chat if path.endswith("chat/completions") else _completion
    for fmt in ({"type": "json_schema"}, {"type": "json_schema", "json_schema": {"name": "x"}}):
        _assert_400(client.post(path, json=body(response_format=fmt)), "json_schema.schema", "required")
    _assert_400(client.post(path, json=body(**_rf([1]))), "response_format")  # not an object
    assert client.post(path, json=body(response_format={"type": "json_object"})).status_code == 200


@pytest.mark.slow
def test_schema_that_is_not_an_object(client: httpx.Client) -> None:
    for text, kind in (("5", "a number"), ('"s"', "a string"), ("[]", "an array"), ("null", "null")):
        _assert_400(client.post("/generate", json=_gen({"json_schema": text})), "json_schema", kind)
    _assert_400(client.post("/v1/completions", json=_completion(json_schema="5")), "must be an object")
