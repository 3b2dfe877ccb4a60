"""Third hardening pass (issue 39): tool schemas through the guarded path, credentials never served,
disconnect aborts by exact rid."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from runtime.engine.grammar_guard import MAX_TOOLS
from runtime.engine.grammar_guard import MAX_TOOLS_CHARS as MAX_TOOLS_SCHEMA_BYTES
from runtime.server.redact import MASK, redact, redact_url


@pytest.fixture(scope="module")
def hardening_client(fuzz_server: Any) -> Any:
    with httpx.Client(base_url=fuzz_server.url, timeout=120) as client:
        yield client


def _ref_chain(hops: int) -> dict[str, Any]:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(hops)}
    defs[f"d{hops}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def _tool(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def _chat(client: Any, tools: list[dict[str, Any]]) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 2}
    return client.post("/v1/chat/completions", json=body)


def test_ref_chain_tool_schema_is_a_400_not_a_crash(hardening_client: Any) -> None:
    r = _chat(hardening_client, [_tool("f", _ref_chain(3000))])  # the 106 KB example
    assert r.status_code == 400, r.text
    assert "tools.0.function.parameters" in r.text or "tools:" in r.text
    assert hardening_client.get("/health").status_code == 200


@pytest.mark.parametrize("hops", [300, 1000])
def test_ref_chain_variants_are_400(hardening_client: Any, hops: int) -> None:
    r = _chat(hardening_client, [_tool("f", _ref_chain(hops))])
    assert r.status_code == 400, r.text
    assert "limit" in r.text or "more than" in r.text
    assert hardening_client.get("/health").status_code == 200


def test_deep_nesting_tool_schema_is_400(hardening_client: Any) -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        node = {"type": "object", "properties": {"a": node}}
    r = _chat(hardening_client, [_tool("f", node)])
    assert r.status_code == 400 and "nested deeper" in r.text, r.text


def test_many_tools_rejected_fast_and_health_stays_up(hardening_client: Any) -> None:
    tools = [
        _tool(f"t{i}", {"type": "object", "properties": {"a": {"type": "string"}}}) for i in range(25_000)
    ]
    done: dict[str, Any] = {}

    def post() -> None:
        done["r"] = _chat(hardening_client, tools)

    worker = threading.Thread(target=post)
    worker.start()
    start = time.monotonic()
    assert hardening_client.get("/health").status_code == 200
    assert time.monotonic() - start < 10
    worker.join(120)
    assert done["r"].status_code == 400 and f"the limit is {MAX_TOOLS}" in done["r"].text


def test_total_schema_bytes_bounded(hardening_client: Any) -> None:
    big = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 4000} for i in range(20)},
    }
    tools = [_tool(f"t{i}", big) for i in range(5)]
    assert len(json.dumps(tools)) > MAX_TOOLS_SCHEMA_BYTES
    r = _chat(hardening_client, tools)
    assert r.status_code == 400 and "characters" in r.text and "limit" in r.text, r.text


def test_redact_urls_and_secret_fields() -> None:
    assert redact_url("redis://:hunter2@cache:6379/0") == f"redis://{MASK}@cache:6379/0"
    assert "s3cr3t" not in redact_url("redis://user:s3cr3t@h/0?token=abc&db=1")
    assert "abc" not in redact_url("https://h/x?token=abc&db=1") and "db=1" in redact_url(
        "https://h/x?token=abc&db=1"
    )
    body = redact(
        {
            "a": {"hicache_storage_url": "redis://u:pw@h:1"},
            "api_key": "k",
            "api_key_set": True,
            "tokenizer_path": "t",
            "admin_api_key": "z",
            "aws_secret": "q",
            "max_total_num_tokens": 5,
        }
    )
    flat = json.dumps(body)
    for secret in ("pw", '"k"', '"z"', '"q"'):
        assert secret not in flat
    assert body["api_key_set"] is True and body["tokenizer_path"] == "t" and body["max_total_num_tokens"] == 5


def test_server_info_serves_no_secret(hardening_client: Any) -> None:
    r = hardening_client.get("/get_server_info")
    assert r.status_code == 200
    assert "@" not in json.dumps(r.json()) or MASK in json.dumps(r.json())


def _run_long(engine: Any, rid: str, out: dict[str, Any]) -> threading.Thread:
    params = {"max_new_tokens": 200, "temperature": 0.0, "ignore_eos": True}
    worker = threading.Thread(
        target=lambda: out.setdefault(rid, engine.generate(prompt="count", sampling_params=params, rid=rid))
    )
    worker.start()
    return worker


@pytest.mark.parametrize(("leaving", "running"), [("job", "job-1234"), ("req-1", "req-10"), ("a", "abc")])
def test_exact_abort_never_reaches_prefixed_rids(small_engine: Any, leaving: str, running: str) -> None:
    out: dict[str, Any] = {}
    worker = _run_long(small_engine, running, out)
    deadline = time.monotonic() + 30
    while (
        small_engine.abort_request(running, exact=True, abort_all=False) == 0 and time.monotonic() < deadline
    ):
        assert small_engine.abort_request(leaving, exact=True) == 0  # the disconnect path's call
        time.sleep(0.01)
    worker.join(60)
    assert not worker.is_alive()


def _server(engine: Any, **kw: Any) -> Any:
    from runtime.server import ServerArgs, create_app
    from tests.support.server_util import LiveServer

    return LiveServer(create_app(engine, ServerArgs(**kw)))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/flush_cache", None),
        ("/abort_request", {"abort_all": True}),
        ("/abort_request", {"rid": "a"}),
        ("/update_weights_from_disk", {"model_path": "/nonexistent"}),
    ],
)
def test_admin_paths_need_the_admin_key(small_engine: Any, path: str, body: Any) -> None:
    tenant = {"Authorization": "Bearer k"}
    with _server(small_engine, api_key="k") as live:  # no admin key: refused for every key holder
        r = httpx.post(live.url + path, json=body, headers=tenant, timeout=60)
        assert r.status_code == 403 and "admin" in r.text, r.text
        assert httpx.get(live.url + "/get_server_info", headers=tenant, timeout=60).status_code == 200
    with _server(small_engine, api_key="k", admin_api_key="adm") as live:
        r = httpx.post(live.url + path, json=body, headers=tenant, timeout=60)
        assert r.status_code == 403, r.text
        r = httpx.post(live.url + path, json=body, headers={"Authorization": "Bearer adm"}, timeout=60)
        assert r.status_code in (200, 400), r.text  # the admin is let through (a bad path is a 400)
        info = httpx.get(live.url + "/get_server_info", headers=tenant, timeout=60).text
        assert "adm" not in info.replace("admin", "")


@pytest.mark.parametrize("name", ["messages", "add_generation_prompt", "tools", "raise_exception"])
def test_template_kwargs_colliding_with_ours_are_400(hardening_client: Any, name: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    body["chat_template_kwargs"] = {name: []}
    r = hardening_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and name in r.text, r.text


@pytest.mark.parametrize(
    ("extra", "limit"),
    [
        ({"logit_bias": {str(i): 1 for i in range(49_152)}}, "logit_bias"),
        ({"logit_bias": {str(i): -1 for i in range(2_000)}}, "logit_bias"),
        ({"stop": [f"s{i}" for i in range(100_000)]}, "stop"),
        ({"stop": ["x" * 5000]}, "stop"),
    ],
)
def test_logit_bias_and_stop_are_capped(hardening_client: Any, extra: dict[str, Any], limit: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    r = hardening_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and limit in r.text and "limit" in r.text, r.text


def _run_salted(engine: Any, rid: str, salt: str, out: dict[str, Any]) -> threading.Thread:
    params = {"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    worker = threading.Thread(
        target=lambda: out.setdefault(
            rid, engine.generate(prompt="count", sampling_params=params, rid=rid, cache_salt=salt)
        )
    )
    worker.start()
    return worker


def _running(engine: Any, rid: str) -> None:
    deadline = time.monotonic() + 30
    while not any(r.rid == rid for r in list(engine.scheduler.live.values())):
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)


def test_a_tenant_abort_reaches_only_its_own_salt(small_engine: Any) -> None:
    """Class 3: a tenant's abort (prefix, abort_all) never stops another tenant's request."""
    out: dict[str, Any] = {}
    worker = _run_salted(small_engine, "job-7", "tenant-a", out)
    _running(small_engine, "job-7")
    assert small_engine.abort_request("job", cache_salt="tenant-b") == 0
    assert small_engine.abort_request(abort_all=True, cache_salt="tenant-b") == 0
    assert small_engine.abort_request("j", cache_salt="tenant-a") == 1
    worker.join(60)
    assert out["job-7"]["meta_info"]["finish_reason"]["type"] == "abort"


def test_abort_request_over_http_is_scoped_to_the_callers_salt(small_engine: Any) -> None:
    tenant = {"Authorization": "Bearer k"}
    with _server(small_engine, api_key="k") as live:
        out: dict[str, Any] = {}
        worker = _run_salted(small_engine, "run-1", "tenant-a", out)
        _running(small_engine, "run-1")
        for body in ({"abort_all": True, "cache_salt": "tenant-b"}, {"rid": "r", "cache_salt": "tenant-b"}):
            r = httpx.post(live.url + "/abort_request", json=body, headers=tenant, timeout=60)
            assert r.status_code == 200, r.text
        r = httpx.post(live.url + "/abort_request", json={"abort_all": True}, headers=tenant, timeout=60)
        assert r.status_code == 403 and "cache_salt" in r.text, r.text
        time.sleep(0.2)
        assert worker.is_alive() and "run-1" not in out  # nothing above reached tenant a
        body = {"rid": "run", "cache_salt": "tenant-a"}
        r = httpx.post(live.url + "/abort_request", json=body, headers=tenant, timeout=60)
        assert r.status_code == 200, r.text
        worker.join(60)
        assert out["run-1"]["meta_info"]["finish_reason"]["type"] == "abort"
    with _server(small_engine, require_cache_salt=True) as live:
        r = httpx.post(live.url + "/abort_request", json={"abort_all": True}, timeout=60)
        assert r.status_code == 400 and "cache_salt" in r.text, r.text


def _deep_schema(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"allOf": [node]}
    return node


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/messages/count_tokens", {"tools": [{"name": "f", "input_schema": _deep_schema(100)}]}),
        (
            "/v1/messages",
            {
                "max_tokens": 2,
                "output_config": {"format": {"type": "json_schema", "schema": _deep_schema(100)}},
            },
        ),
        ("/v1/messages", {"max_tokens": 2, "output_config": {"format": 5}}),
        ("/v1/messages", {"max_tokens": 2, "output_config": {"format": {"type": "json_schema"}}}),
    ],
)
def test_messages_schemas_too_deep_or_malformed_are_400(
    hardening_client: Any, path: str, extra: dict
) -> None:
    """Class 1 on the Messages door (found by the extended fuzz): a schema past the depth limit
    or a malformed output format was a 500; it is a 400 naming the field."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    r = hardening_client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
