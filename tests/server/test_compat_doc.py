"""docs/compat.md cannot drift from the code: its field tables are compared with the request schemas
in both directions, every refused field is sent and must get a 400 naming it, and its endpoint table
matches the app's routes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from runtime.server import schemas
from runtime.server.messages.models import MessagesRequest
from runtime.server.responses.models import ResponsesRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "compat.md"
#: where a refused field is sent: path, a valid body, and where the field goes (dotted; None: top level)
PROBES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "GenerateRequest": ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}, None),
    "SamplingParamsIn": (
        "/generate",
        {"text": "hi", "sampling_params": {"max_new_tokens": 1}},
        "sampling_params",
    ),
    "CompletionRequest": ("/v1/completions", {"prompt": "hi", "max_tokens": 1}, None),
    "ChatCompletionRequest": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        None,
    ),
    "StreamOptions": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "stream": True,
            "stream_options": {},
        },
        "stream_options",
    ),
    "ResponseFormat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "response_format": {"type": "text"},
        },
        "response_format",
    ),
    "JsonSchemaFormat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        },
        "response_format.json_schema",
    ),
    "AbortRequestBody": ("/abort_request", {"rid": "compat-probe"}, None),
    "UpdateWeightsFromDiskBody": ("/update_weights_from_disk", {"model_path": "/nonexistent/model"}, None),
    "OpenSessionRequest": ("/open_session", {}, None),
    "CloseSessionRequest": ("/close_session", {"session_id": "compat-probe"}, None),
    "SessionEventRequest": ("/session_event", {"session_id": "compat-probe", "event": "resume"}, None),
    "TokenizeRequest": ("/tokenize", {"prompt": "hi"}, None),
    "DetokenizeRequest": ("/detokenize", {"tokens": [1]}, None),
    "MessagesRequest": (
        "/v1/messages",
        {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        None,
    ),
    "ResponsesRequest": ("/v1/responses", {"input": "hi", "max_output_tokens": 1}, None),
}
#: the front doors' request models (the others are in runtime/server/schemas.py)
DOOR_MODELS: dict[str, type[BaseModel]] = {
    "MessagesRequest": MessagesRequest,
    "ResponsesRequest": ResponsesRequest,
}
#: FastAPI's own pages, and routes only a flag turns on
NOT_API = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/debug/integrity"}

Row = tuple[str, str, str]  # status, example (JSON text or ""), note


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def parse_doc() -> tuple[dict[str, dict[str, Row]], dict[str, str]]:
    """({schema class: {field: row}}, {"METHOD /path": status}) from docs/compat.md."""
    tables: dict[str, dict[str, Row]] = {}
    endpoints: dict[str, str] = {}
    section: str | None = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"^## .*— `(\w+)`$", line)
        if heading:
            section = heading.group(1)
            tables[section] = {}
            continue
        if line.startswith("## "):
            section = "endpoints" if line.strip() == "## Endpoints" else None
            continue
        if section is None or not line.startswith("| `"):
            continue
        cells = _cells(line)
        if section == "endpoints":
            endpoints[_unquote(cells[0])] = cells[1]
        else:
            tables[section][_unquote(cells[0])] = (cells[1], _unquote(cells[2]), cells[3])
    return tables, endpoints


def _declared(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


TABLES, ENDPOINTS = parse_doc()


def test_every_schema_field_is_in_the_table_and_every_honoured_row_is_a_schema_field() -> None:
    assert set(PROBES) == set(TABLES), "a table per request schema, and a probe per table"
    problems = []
    for name, rows in TABLES.items():
        model = DOOR_MODELS.get(name) or getattr(schemas, name)
        declared = _declared(model)
        for field in sorted(declared - set(rows)):
            problems.append(f"{name}.{field}: accepted by the schema, missing from docs/compat.md")
        for field, (status, _, _) in rows.items():
            assert status in ("honoured", "refused", "n/a"), (name, field, status)
            if status != "refused" and field not in declared:
                problems.append(
                    f"{name}.{field}: {status} in docs/compat.md but the schema does not accept it"
                )
    assert not problems, "\n".join(problems)


def _refused() -> list[tuple[str, str, str]]:
    return [
        (name, field, example)
        for name, rows in TABLES.items()
        for field, (status, example, _) in rows.items()
        if status == "refused"
    ]


@pytest.mark.slow
def test_every_refused_field_gets_a_400_naming_it(server) -> None:
    refused = _refused()
    assert len(refused) > 100  # OpenAI's and SGLang's fields we do not serve
    failures = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for name, field, example in refused:
            path, body, where = PROBES[name]
            assert example, f"{name}.{field}: a refused row needs an example value"
            body = json.loads(json.dumps(body))
            target = body
            for key in where.split(".") if where else ():
                target = target[key]
            target[field] = json.loads(example)
            r = client.post(path, json=body)
            message = r.json().get("error", {}).get("message", "") if r.status_code == 400 else r.text
            if r.status_code != 400 or field not in message:
                failures.append(f"{name}.{field}: {r.status_code} {message[:120]}")
    assert not failures, "\n".join(failures)


def _routes(routes: list[Any]) -> set[str]:
    """`METHOD /path` of every route, through included routers (FastAPI keeps them nested)."""
    out: set[str] = set()
    for route in routes:
        nested = getattr(route, "original_router", None)
        if nested is not None:
            out |= _routes(nested.routes)
        elif getattr(route, "path", None) not in NOT_API:
            out |= {f"{m} {route.path.replace(':path', '')}" for m in route.methods or () if m != "HEAD"}
    return out


@pytest.mark.slow
def test_endpoint_table_matches_the_routes(server) -> None:
    routes = _routes(server.server.config.app.routes)
    served = {e for e, status in ENDPOINTS.items() if status == "served"}
    assert routes == served, (sorted(routes - served), sorted(served - routes))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for endpoint, status in ENDPOINTS.items():
            if status == "not served":
                assert client.post(endpoint).status_code == 404, endpoint


def test_router_defaults_are_taken_and_other_values_refused(server) -> None:
    """smg / sglang-router forward /generate with SGLang's defaults for these fields."""
    body = {
        "text": "hi",
        "sampling_params": {"max_new_tokens": 1},
        "model": "default",
        **schemas.ROUTER_DEFAULTS,
    }
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.post("/generate", json=body).status_code == 200
        assert client.post("/generate", json={**body, "model": None}).status_code == 200  # sglang-router
        for field, value in schemas.ROUTER_DEFAULTS.items():
            r = client.post("/generate", json={**body, field: not value})
            assert r.status_code == 400 and field in r.json()["error"]["message"], field
