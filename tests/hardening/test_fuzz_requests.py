"""Request-level fuzz (issue 17) against a `radixagent serve` subprocess: randomized grammars and
schemas (depth, size, `$ref` chains and cycles, non-object schemas, regex repetitions), conflicting
framing headers over raw sockets, and nested message fields.

Every answer must be < 500 with the JSON error shape, and the server process must be alive and
healthy at the end (a crash is a dead process, not a status). Prints one `fuzz-requests: {...}`
line (requests, statuses, RSS before/after) that `make stress` reads. RADIXAGENT_FUZZ_LONG=1 runs
~5x more cases, randomized.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.server.ready import NotReady, wait_ready

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("RADIXAGENT_FUZZ_LONG", "") not in ("", "0")
CASES = 300 if LONG else 60  # per family
KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 2 * 2**20

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Served:
    """`radixagent serve` in a subprocess on a free loopback port, small limits."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "runtime.cli",
            "serve",
            "--port",
            str(self.port),
            "--max-total-tokens",
            "4096",
            "--context-length",
            "512",
            "--api-key",
            KEY,
            "--max-request-bytes",
            str(MAX_BODY),
            "--timeout-read",
            "2",
            "--log-level",
            "warning",
            "--trace-dir",
            str(log.parent / "trace"),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = log.open("wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_ready(self.url, self.proc, timeout_s=240)
        except NotReady as exc:
            raise RuntimeError(f"{exc}: {log.read_text()[-2000:]}") from None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()
        return self.proc.returncode


class Tally:
    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.server_errors: list[str] = []

    def record(self, status: int | str, what: str, body: bytes = b"") -> None:
        self.statuses[str(status)] += 1
        if isinstance(status, int) and status >= 500:
            self.server_errors.append(f"{status} {what[:200]}: {body[:300]!r}")
        elif isinstance(status, int) and status >= 400:
            error = json.loads(body)["error"]
            assert {"message", "type"} <= set(error), (what, body[:300])

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def family(self, served: Served) -> Iterator[None]:
        """Each family checks its own answers: run alone, it still fails on a 5xx or a crash."""
        seen = len(self.server_errors)
        yield
        assert not self.server_errors[seen:], "\n".join(self.server_errors[seen:][:20])
        assert served.proc.poll() is None, "the server process died"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("fuzz") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tally() -> Tally:
    return Tally()


@pytest.fixture(scope="module")
def rss(served: Served) -> dict[str, float]:
    return {"before": _rss_mib(served.proc.pid), "fds_before": _fds(served.proc.pid)}


@pytest.fixture
def family(served: Served, tally: Tally) -> Iterator[None]:
    yield from tally.family(served)


# ---- generators ----------------------------------------------------------------------------------


def random_schema(rng: random.Random) -> Any:
    kind = rng.choice(["chain", "cycle", "deep", "wide", "pattern", "scalar", "big", "tree"])
    if kind == "chain":
        n = rng.choice([1, 10, 100, 255, 257, 1000, 2500, 4000])
        defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
        defs[f"d{n}"] = {"type": rng.choice(["string", "integer"])}
        return {"$defs": defs, "$ref": "#/$defs/d0"}
    if kind == "cycle":
        k = rng.randint(1, 8)
        defs = {f"c{i}": {"$ref": f"#/$defs/c{rng.randrange(k)}"} for i in range(k)}
        if rng.random() < 0.5:
            defs["c0"] = {"type": "object", "properties": {"next": {"$ref": "#/$defs/c1" if k > 1 else "#"}}}
        return {"$defs": defs, "$ref": "#/$defs/c0"}
    if kind == "deep":
        node: Any = {"type": "string"}
        for _ in range(rng.choice([5, 30, 63, 64, 100, 400])):
            node = rng.choice(
                [
                    {"type": "array", "items": node},
                    {"anyOf": [node, {"type": "null"}]},
                    {"type": "object", "properties": {"a": node}},
                    {"allOf": [node]},
                ]
            )
        return node
    if kind == "wide":
        props = {
            f"p{i}": {"type": rng.choice(["string", "integer", "boolean"])}
            for i in range(rng.choice([3, 300]))
        }
        return {"type": "object", "properties": props, "required": list(props)[: rng.randint(0, 3)]}
    if kind == "pattern":
        return {"type": "string", "pattern": random_regex(rng)}
    if kind == "scalar":
        return rng.choice([5, "5", None, [], [{}], 1.5, True, False, "", {"type": 5}, {"$ref": 7}])
    if kind == "big":
        return {"type": "string", "description": "x" * rng.choice([1000, 70_000, 500_000])}
    return {
        "$defs": {
            "n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}
        },
        "$ref": "#/$defs/n",
    }


def random_regex(rng: random.Random) -> str:
    atom = rng.choice(["a", "[a-z]", r"\d", "(ab|cd)", ".", "[^x]"])
    for _ in range(rng.randint(0, 3)):
        atom = f"({atom}){{{rng.choice([1, 3, 10, 100, 1000, 10000])}}}"
    return rng.choice(
        [atom, atom + "x", "(" * rng.randint(1, 300) + "a" + ")" * rng.randint(1, 300), atom + "{"]
    )


DEEP = "__deep__"  # placeholder, replaced by deep_json's text (json.dumps itself recurses)


def deep_json(rng: random.Random, depth: int) -> str:
    """`depth` nested objects/arrays around "x", as JSON text."""
    kinds = [rng.random() < 0.5 for _ in range(depth)]
    opens = "".join('{"k":' if obj else "[" for obj in kinds)
    return opens + '"x"' + "".join("}" if obj else "]" for obj in reversed(kinds))


def nested_chat(rng: random.Random) -> dict[str, Any]:
    """A chat body with DEEP somewhere a client may nest (see deep_json)."""
    where = rng.choice(["extra", "tool_calls", "content", "tools", "kwargs", "name"])
    user: dict[str, Any] = {"role": "user", "content": "hi"}
    body: dict[str, Any] = {"messages": [user], "max_tokens": 2, "temperature": 0}
    if where == "extra":
        user["meta"] = DEEP
    elif where == "tool_calls":
        body["messages"] = [{"role": "assistant", "content": "", "tool_calls": [DEEP]}, user]
    elif where == "content":
        user["content"] = [{"type": "text", "text": DEEP}]
    elif where == "tools":
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]
    elif where == "kwargs":
        body["chat_template_kwargs"] = {"x": DEEP}
    else:
        user["name"] = DEEP
    return body


# ---- families ------------------------------------------------------------------------------------


def _post(client: httpx.Client, tally: Tally, path: str, body: Any, deep: str = "") -> None:
    raw = json.dumps(body).replace(json.dumps(DEEP), deep).encode()
    try:
        r = client.post(path, content=raw, headers={**AUTH, "content-type": "application/json"})
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
        # a body over --max-request-bytes is answered 413 and the connection closed mid-upload
        assert len(raw) > MAX_BODY, f"{path}: connection dropped on a {len(raw)}-byte body"
        tally.record("closed", path)
        return
    tally.record(r.status_code, f"{path} {raw[:200]!r}", r.content)


def test_grammars_and_schemas(served: Served, tally: Tally, rss: dict[str, float], family: None) -> None:
    rng = random.Random(None if LONG else 17)
    with httpx.Client(base_url=served.url, timeout=120) as client:
        for _ in range(CASES):
            schema = random_schema(rng)
            text = json.dumps(schema) if rng.random() < 0.9 else json.dumps(schema)[:-1]
            route = rng.randrange(5)
            if route == 0:
                _post(
                    client,
                    tally,
                    "/generate",
                    {"text": "JSON:", "sampling_params": {"max_new_tokens": 2, "json_schema": text}},
                )
            elif route == 1:
                _post(
                    client,
                    tally,
                    "/v1/completions",
                    {"prompt": "JSON:", "max_tokens": 2, "json_schema": text},
                )
            elif route in (2, 3):
                fmt: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
                if rng.random() < 0.2:
                    fmt = rng.choice([{"type": "json_schema"}, {"type": "json_schema", "json_schema": {}}])
                path = "/v1/chat/completions" if route == 2 else "/v1/completions"
                base = (
                    {"messages": [{"role": "user", "content": "JSON"}]} if route == 2 else {"prompt": "JSON"}
                )
                _post(client, tally, path, {**base, "max_tokens": 2, "response_format": fmt})
            else:
                _post(
                    client,
                    tally,
                    "/generate",
                    {"text": "Digits:", "sampling_params": {"max_new_tokens": 2, "regex": random_regex(rng)}},
                )


def _raw(port: int, data: bytes) -> tuple[int | str, bytes]:
    """Send raw bytes; the status of the first response (or "closed"/"timeout") and its body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    return "closed", buf
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            while len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            return int(head.split()[1]), body[:length]
        except (ConnectionResetError, BrokenPipeError):
            return "closed", b""
        except TimeoutError:
            return "timeout", b""


def random_framing(rng: random.Random) -> bytes:
    body = json.dumps(
        {
            "text": "hi",
            "sampling_params": {"max_new_tokens": 1},
            "pad": "x" * rng.choice([0, 100, MAX_BODY + 10]),
        }
    ).encode()
    chunked = (
        b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 4096]), body[i : i + 4096]) for i in range(0, len(body), 4096)
        )
        + b"0\r\n\r\n"
    )
    headers = [b"POST /generate HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    auth = rng.choice(["one", "none", "two", "wrong", "two-mixed"])
    token = {"one": [KEY], "none": [], "two": [KEY, KEY], "wrong": ["bad"], "two-mixed": [KEY, "bad"]}[auth]
    headers += [b"Authorization: Bearer " + t.encode() for t in token]
    framing = rng.choice(["cl", "te", "both", "two-cl", "cl-short", "te-odd", "bad-chunk", "none"])
    payload = body
    if framing == "cl":
        headers.append(b"Content-Length: %d" % len(body))
    elif framing == "te":
        headers.append(b"Transfer-Encoding: chunked")
        payload = chunked
    elif framing == "both":
        headers += [b"Content-Length: %d" % rng.choice([10, len(body)]), b"Transfer-Encoding: chunked"]
        payload = chunked
    elif framing == "two-cl":
        headers += [b"Content-Length: %d" % len(body), b"Content-Length: %d" % (len(body) + 1)]
    elif framing == "cl-short":
        headers.append(b"Content-Length: %d" % max(1, len(body) // 2))
    elif framing == "te-odd":
        headers.append(
            rng.choice(
                [
                    b"Transfer-Encoding: gzip",
                    b"Transfer-Encoding: chunked, chunked",
                    b"Transfer-Encoding: xchunked",
                ]
            )
        )
        payload = chunked
    elif framing == "bad-chunk":
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"zz\r\n" + body[:10] + b"\r\n0\r\n\r\n"
    if rng.random() < 0.1:
        headers.append(b"X-Big: " + b"y" * rng.choice([1000, 100_000]))
    return b"\r\n".join(headers) + b"\r\n\r\n" + payload


def test_conflicting_framing_headers(served: Served, tally: Tally, family: None) -> None:
    rng = random.Random(None if LONG else 23)
    for _ in range(CASES):
        data = random_framing(rng)
        status, body = _raw(served.port, data)
        tally.record(status, data[:300].decode("latin-1"), body)
    for garbage in (b"GARBAGE\r\n\r\n", b"\x00\x01\x02\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n"):
        status, body = _raw(served.port, garbage)
        tally.record(status, repr(garbage), body)


def test_nested_message_fields(served: Served, tally: Tally, family: None) -> None:
    rng = random.Random(None if LONG else 29)
    with httpx.Client(base_url=served.url, timeout=120) as client:
        for _ in range(CASES):
            depth = rng.choice([2, 20, 63, 64, 65, 200, 900, 2000, 100_000])
            _post(client, tally, "/v1/chat/completions", nested_chat(rng), deep_json(rng, depth))
        for depth in (100, 1000, 5000):
            _post(client, tally, "/generate", {"text": "hi", "session_params": DEEP}, deep_json(rng, depth))


def random_tools_body(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A user schema in every field that carries one on the front doors: chat `tools`,
    Responses `tools` and `text.format`, Messages `tools[].input_schema` and `output_config`."""
    schema = random_schema(rng)
    many = rng.random() < 0.1 and len(json.dumps(schema)) < 200  # 5,000 small tools, not 5,000 big ones
    count = rng.choice([2, 300, 5000]) if many else 1
    door = rng.choice(["chat", "responses", "responses_text", "messages", "messages_format", "count"])
    if door == "chat":
        tools = [
            {"type": "function", "function": {"name": f"f{i}", "parameters": schema}} for i in range(count)
        ]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": tools}
        return "/v1/chat/completions", {**body, "tool_choice": rng.choice(["auto", "required", "none"])}
    if door == "responses":
        tools = [{"type": "function", "name": f"f{i}", "parameters": schema} for i in range(count)]
        return "/v1/responses", {
            "input": "hi",
            "max_output_tokens": 2,
            "tools": tools,
            "tool_choice": "required",
        }
    if door == "responses_text":
        fmt = {"type": "json_schema", "name": "x", "schema": schema}
        return "/v1/responses", {"input": "hi", "max_output_tokens": 2, "text": {"format": fmt}}
    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"name": f"f{i}", "input_schema": schema} for i in range(count)]
    if door == "messages_format":
        body = {"model": "m", "max_tokens": 2, "messages": msgs}
        return "/v1/messages", {
            **body,
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
    if door == "count":
        return "/v1/messages/count_tokens", {"model": "m", "messages": msgs, "tools": tools}
    body = {"model": "m", "max_tokens": 2, "messages": msgs, "tools": tools}
    return "/v1/messages", {**body, "tool_choice": rng.choice([{"type": "any"}, {"type": "auto"}])}


def test_tool_schemas_on_every_door(served: Served, tally: Tally, family: None) -> None:
    rng = random.Random(None if LONG else 31)
    with httpx.Client(base_url=served.url, timeout=120) as client:
        for _ in range(CASES):
            path, body = random_tools_body(rng)
            _post(client, tally, path, body)


def _junk(rng: random.Random) -> Any:
    return rng.choice([None, 0, -1, 1e308, "", "x" * 5000, [], {}, [{}], {"type": 5}, True, "\ud800"])


def random_door_body(rng: random.Random) -> tuple[str, str, Any]:
    """(method, path, body) for this round's endpoints, valid-looking with one part broken."""
    kind = rng.choice(["responses", "messages", "stored", "control", "logprobs"])
    if kind == "responses":
        item = rng.choice(
            [
                {"type": "function_call", "call_id": _junk(rng), "name": "f", "arguments": _junk(rng)},
                {"type": "function_call_output", "call_id": "c", "output": _junk(rng)},
                {"type": "reasoning", "summary": _junk(rng)},
                {
                    "role": rng.choice(["user", "tool", "x"]),
                    "content": [{"type": "input_text", "text": _junk(rng)}],
                },
                {"type": _junk(rng)},
            ]
        )
        body = {"input": [item], "max_output_tokens": rng.choice([1, 2, 0, -1])}
        extra = rng.choice(
            [
                {},
                {"previous_response_id": rng.choice(["resp_x", "", "../..", "x" * 10_000])},
                {"include": [_junk(rng)]},
                {"truncation": _junk(rng)},
                {"reasoning": {"effort": _junk(rng)}},
                {"stream": True},
                {"prompt_cache_key": _junk(rng)},
            ]
        )
        return "POST", "/v1/responses", {**body, **extra}
    if kind == "messages":
        block = rng.choice(
            [
                {"type": "tool_use", "id": _junk(rng), "name": "f", "input": _junk(rng)},
                {"type": "tool_result", "tool_use_id": "t", "content": _junk(rng), "is_error": _junk(rng)},
                {"type": "thinking", "thinking": _junk(rng)},
                {"type": "text", "text": _junk(rng), "cache_control": _junk(rng)},
                {"type": _junk(rng)},
            ]
        )
        role = rng.choice(["user", "assistant"])
        body = {
            "model": "m",
            "max_tokens": rng.choice([1, 2, 0]),
            "messages": [{"role": role, "content": [block]}],
        }
        extra = rng.choice(
            [
                {},
                {"system": _junk(rng)},
                {"metadata": {"user_id": _junk(rng)}},
                {"diagnostics": {"previous_message_id": _junk(rng)}},
                {"stop_sequences": [_junk(rng)]},
                {"stream": True},
            ]
        )
        return "POST", rng.choice(["/v1/messages", "/v1/messages/count_tokens"]), {**body, **extra}
    if kind == "stored":
        rid = rng.choice(["resp_x", "x" * 5000, "%2e%2e", "resp_" + "0" * 24])
        method = rng.choice(["GET", "DELETE"])
        return method, f"/v1/responses/{rid}" + rng.choice(["", "/input_items"]), None
    if kind == "control":
        path, body = rng.choice(
            [
                ("/abort_request", {"rid": _junk(rng), "cache_salt": _junk(rng)}),
                ("/abort_request", {"abort_all": True}),
                (
                    "/update_weights_from_disk",
                    {"model_path": rng.choice(["/dev/zero", "/", "x", "/proc/self/mem"])},
                ),
                ("/flush_cache", None),
            ]
        )
        return "POST", path, body
    body = {
        "text": "hi",
        "return_logprob": True,
        "top_logprobs_num": rng.choice([0, 5, 50, 10_000]),
        "sampling_params": {"max_new_tokens": 2, "n": rng.choice([1, 4, 16, 100])},
        "logprob_start_len": rng.choice([0, -1, 10_000]),
    }
    return "POST", "/generate", body


def test_new_endpoints(served: Served, tally: Tally, family: None) -> None:
    rng = random.Random(None if LONG else 37)
    with httpx.Client(base_url=served.url, timeout=120) as client:
        for _ in range(CASES):
            method, path, body = random_door_body(rng)
            raw = json.dumps(body).encode() if body is not None else b""
            r = client.request(
                method, path, content=raw, headers={**AUTH, "content-type": "application/json"}
            )
            tally.record(
                r.status_code, f"{method} {path} {raw[:200]!r}", r.content if r.status_code >= 400 else b""
            )


def test_trace_dir_under_many_sessions_and_salts(served: Served, tally: Tally, family: None) -> None:
    """Every request names a new session, half under a new salt: files and fds stay bounded."""
    rng = random.Random(None if LONG else 41)
    with httpx.Client(base_url=served.url, timeout=120) as client:
        for i in range(CASES * 3):
            body: dict[str, Any] = {"text": f"s{i}", "sampling_params": {"max_new_tokens": 1}}
            body["session_params"] = {"id": f"sess-{rng.random()}"} if i % 3 == 0 else None
            if i % 2:
                body["cache_salt"] = f"salt-{i}-{rng.random()}"
            headers = {**AUTH, "X-Session-Id": f"h-{i}"}
            r = client.post(
                "/generate", json={k: v for k, v in body.items() if v is not None}, headers=headers
            )
            tally.record(r.status_code, f"trace {i}", r.content if r.status_code >= 400 else b"")
    info = httpx.get(f"{served.url}/get_server_info", headers=AUTH, timeout=30).json()
    trace = info["trace_dir"]
    assert trace["open_files"] <= 64, trace
    assert _fds(served.proc.pid) < 200


def test_server_survived(served: Served, tally: Tally, rss: dict[str, float]) -> None:
    assert served.proc.poll() is None, "the server process died"
    assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
    r = httpx.post(
        f"{served.url}/generate",
        headers=AUTH,
        timeout=60,
        json={"text": "hi", "sampling_params": {"max_new_tokens": 1}},
    )
    assert r.status_code == 200
    summary = {
        "requests": tally.total,
        "statuses": dict(sorted(tally.statuses.items())),
        "server_errors": len(tally.server_errors),
        "crashes": 0 if served.proc.poll() is None else 1,
        "rss_before_mib": round(rss["before"], 1),
        "rss_after_mib": round(_rss_mib(served.proc.pid), 1),
        "fds_before": rss["fds_before"],
        "fds_after": _fds(served.proc.pid),
    }
    print(f"\nfuzz-requests: {json.dumps(summary)}")
    assert not tally.server_errors, "\n".join(tally.server_errors[:20])
    assert tally.total >= 3 * CASES
