"""Faults: flaky servers, a crashing agent process, failing tools, and SIGTERM during a request.

The retry tests run the HTTP backends against a scripted server on 127.0.0.1 (no model): each
request takes the next fault from a script (drop the connection, stall past the client timeout,
cut a stream after one chunk, answer 5xx or 4xx) and then answers like SGLang's /generate or an
OpenAI /v1/completions stream. The crash test runs an agent in a subprocess that dies with
os._exit() in the middle of a run. Only the SIGTERM test loads the real model (`radixagent serve`
as a subprocess, once).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]

from agent import Agent, tool  # noqa: E402
from agent.trace import read_trace  # noqa: E402
from runtime.backends.openai_compat import OpenAIBackend  # noqa: E402
from runtime.backends.retry import with_retries  # noqa: E402
from runtime.backends.sglang import SGLangBackend  # noqa: E402
from runtime.errors import BackendError  # noqa: E402
from runtime.server.cli import serve_argv  # noqa: E402
from runtime.server.ready import NotReady, wait_ready  # noqa: E402
from tests.support.fake_backend import FakeBackend  # noqa: E402

STALL_S = 1.0  # how long a "stall" fault sleeps; the client timeout in these tests is shorter
CLIENT_TIMEOUT_S = 0.3
BACKOFF_S = 0.01  # the first retry wait (the default 0.5 s schedule: test_the_default_backoff_...)


# ---- a scripted flaky server ---------------------------------------------------------------------


class FlakyServer:
    """Loopback HTTP server: request i takes faults[i] (then "ok" forever). Counts requests per path.

    Faults: "drop" (close without a response), "stall" (sleep past the client timeout), "cut" (a 200
    stream that closes after one chunk), an int status (e.g. 503: an error body), "ok".
    """

    def __init__(self, faults: list[str | int]) -> None:
        self.faults = list(faults)
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})

    def next_fault(self, path: str) -> str | int:
        with self._lock:
            self.requests.append(path)
            return self.faults.pop(0) if self.faults else "ok"

    def __enter__(self) -> FlakyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


def _sglang_chunk(text: str, finish: str | None) -> dict[str, Any]:
    meta = {
        "id": "r1",
        "prompt_tokens": 5,
        "completion_tokens": len(text.split()),
        "cached_tokens": 2,
        "finish_reason": {"type": finish} if finish else None,
        "e2e_latency": 0.01,
    }
    return {"text": text, "output_ids": [7] * len(text.split()), "meta_info": meta}


def _openai_chunks() -> list[dict[str, Any]]:
    base = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m"}
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    return [
        {**base, "choices": [{"index": 0, "text": "hello", "finish_reason": None, "logprobs": None}]},
        {**base, "choices": [{"index": 0, "text": " world", "finish_reason": "stop", "logprobs": None}]},
        {**base, "choices": [], "usage": usage},
    ]


def _handler(server: FlakyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # /health, /get_model_info
            self._send_json(200, {"ok": True})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            fault = server.next_fault(self.path)
            if fault == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault == "stall":
                time.sleep(STALL_S)
                self.close_connection = True
                return
            if isinstance(fault, int):
                self._send_json(fault, {"error": {"message": f"injected {fault}", "type": "fault"}})
                return
            if self.path.startswith("/v1/completions"):
                self._stream(_openai_chunks(), cut=fault == "cut")
            elif body.get("stream"):
                self._stream(
                    [_sglang_chunk("hello", None), _sglang_chunk("hello world", "stop")], cut=fault == "cut"
                )
            else:
                self._send_json(200, _sglang_chunk("hello world", "stop"))

        def _send_json(self, status: int, data: dict[str, Any]) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _stream(self, chunks: list[dict[str, Any]], cut: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for chunk in chunks[:1] if cut else chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            if cut:  # the peer vanishes mid-stream: no [DONE]
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


def sglang(url: str, stream: bool = True, attempts: int = 4) -> SGLangBackend:
    return SGLangBackend(
        url,
        timeout_s=CLIENT_TIMEOUT_S,
        connect_timeout_s=CLIENT_TIMEOUT_S,
        max_attempts=attempts,
        retry_backoff_s=BACKOFF_S,
        stream=stream,
    )


# ---- retries ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "once"])
@pytest.mark.parametrize("faults", [["drop", 503, 500], ["stall", "drop"], ["cut", 502]], ids=str)
def test_sglang_retries_transient_faults_then_succeeds(faults: list[Any], stream: bool) -> None:
    if "cut" in faults and not stream:
        faults = ["drop" if f == "cut" else f for f in faults]
    with FlakyServer(faults) as srv:
        backend = sglang(srv.url, stream=stream)
        try:
            done = backend.generate("hi", sampling_params={"max_new_tokens": 4})
        finally:
            backend.close()
    assert done.text == "hello world" and done.cached_tokens == 2 and done.prompt_tokens == 5
    assert len(srv.requests) == len(faults) + 1  # one try per fault, then the answer


@pytest.mark.parametrize("fault", ["drop", "stall", 503, 500], ids=str)
def test_sglang_gives_up_after_the_bound(fault: Any) -> None:
    with FlakyServer([fault] * 10) as srv:
        backend = sglang(srv.url, attempts=3)
        started = time.monotonic()
        try:
            with pytest.raises(BackendError) as info:
                backend.generate("hi")
        finally:
            backend.close()
    assert info.value.retryable
    assert info.value.status == (fault if isinstance(fault, int) else None)
    assert len(srv.requests) == 3  # exactly the bound, no more
    assert time.monotonic() - started < 3 * STALL_S + 3  # backoff is bounded too


def test_the_default_backoff_waits_half_a_second_then_doubles_up_to_the_cap() -> None:
    """The real schedule (the tests above shorten it), with the waits recorded instead of slept."""

    def failing(times: int):
        calls = iter(range(times + 1))

        def fn() -> int:
            if next(calls) < times:
                raise BackendError("injected 503", status=503, retryable=True)
            return 7

        return fn

    waits: list[float] = []
    assert with_retries(failing(5), attempts=6, sleep=waits.append) == 7
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0]
    waits.clear()
    with pytest.raises(BackendError, match="injected"):
        with_retries(failing(5), attempts=3, sleep=waits.append)
    assert waits == [0.5, 1.0]  # the bound: 3 attempts, 2 waits, then the last error
    waits.clear()
    with pytest.raises(BackendError, match="injected"):
        with_retries(failing(1), attempts=1, backoff_s=0.01, sleep=waits.append)
    assert waits == []


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_sglang_4xx_is_final_at_once(status: int) -> None:
    with FlakyServer([status]) as srv:
        backend = sglang(srv.url)
        try:
            with pytest.raises(BackendError) as info:
                backend.generate("hi")
        finally:
            backend.close()
    assert info.value.status == status and not info.value.retryable
    assert f"injected {status}" in info.value.message
    assert len(srv.requests) == 1


def test_sglang_helper_calls_retry_too() -> None:
    with FlakyServer(["drop", 503]) as srv:
        backend = sglang(srv.url)
        try:
            assert backend.model_info() == {"ok": True}  # GET: no faults scripted for GETs
            backend.session_event("s", "open")  # POST /session_event: drop, 503, then ok
        finally:
            backend.close()
    assert srv.requests == ["/session_event"] * 3


def test_openai_backend_retries_5xx_and_drops_but_not_4xx() -> None:
    with FlakyServer(["drop", "cut", 503]) as srv:
        backend = OpenAIBackend(
            srv.url, model="m", timeout_s=CLIENT_TIMEOUT_S, max_attempts=4, retry_backoff_s=BACKOFF_S
        )
        try:
            done = backend.generate("hi", sampling_params={"max_new_tokens": 4})
        finally:
            backend.close()
    assert done.text == "hello world" and done.cached_tokens == 3 and len(srv.requests) == 4
    error, calls = _openai_failure([400, 503], attempts=4)
    assert error.status == 400 and not error.retryable and calls == 1
    error, calls = _openai_failure([503] * 10, attempts=2)
    assert error.status == 503 and error.retryable and calls == 2


def _openai_failure(faults: list[Any], attempts: int) -> tuple[BackendError, int]:
    """The error OpenAIBackend.generate ends with against scripted faults, and the requests it made."""
    with FlakyServer(faults) as srv:
        backend = OpenAIBackend(
            srv.url, model="m", timeout_s=CLIENT_TIMEOUT_S, max_attempts=attempts, retry_backoff_s=BACKOFF_S
        )
        try:
            with pytest.raises(BackendError) as info:
                backend.generate("hi")
        finally:
            backend.close()
    return info.value, len(srv.requests)


# ---- the agent's trace survives a crash mid-run ----------------------------------------------------

CRASHING_AGENT = textwrap.dedent(
    """
    import os, sys
    from tests.support.fake_backend import FakeBackend
    from tests.support.behaviour import SYSTEM, add
    from agent import Agent

    CRASH_AT = int(sys.argv[2])
    outputs = ['{"tool":"add","arguments":{"a":%d,"b":1}}' % i for i in range(20)]

    def model(call):
        if call.index == CRASH_AT:
            os._exit(17)  # the process dies mid-call: no cleanup, no close, no atexit
        return outputs[call.index]

    Agent(FakeBackend(model), system=SYSTEM, tools=[add], trace_path=sys.argv[1], reflect=False,
          max_steps=20).run("Keep adding.")
    """
)


def test_trace_survives_a_crash_mid_run(tmp_path: Path) -> None:
    path, crash_at = tmp_path / "trace.jsonl", 4
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "agent"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_AGENT, str(path), str(crash_at)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 17, proc.stderr
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == crash_at  # every completed step, none of the one in flight
    records = read_trace(path)  # valid JSONL with every trace field
    assert [r.step for r in records] == list(range(crash_at))
    assert all(r.tool and r.tool["result"] == str(i + 1) for i, r in enumerate(records))
    shown = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "trace", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"steps {crash_at}" in shown.stdout


# ---- tool failures inside the loop -----------------------------------------------------------------


@tool
def explode(x: int) -> int:
    """Always fails."""
    raise RuntimeError(f"boom {x}")


@tool(timeout_s=0.05)
def hang(x: int) -> int:
    """Takes too long."""
    time.sleep(1.0)
    return x


@tool
def fine(x: int) -> int:
    """Works."""
    return x * 2


def test_tool_exceptions_and_timeouts_do_not_end_the_loop() -> None:
    outputs = [
        '{"tool":"explode","arguments":{"x":1}}',
        '{"tool":"hang","arguments":{"x":2}}',
        '{"tool":"fine","arguments":{"x":3}}',
        '{"answer":"6"}',
    ]
    backend = FakeBackend(outputs)
    result = Agent(backend, system="calc", tools=[explode, hang, fine], reflect=False).run("t")
    assert result.status == "answered" and result.answer == "6"
    errors = [r.tool["error"] if r.tool else None for r in result.trace]
    assert errors[0] == "RuntimeError: boom 1" and "timed out" in errors[1] and errors[2] is None
    assert "(exception)" in backend.calls[1].prompt and "(timeout)" in backend.calls[2].prompt
    assert not result.prefix_breaks


# ---- SIGTERM drains in-flight requests (real model, one server start) ------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    cmd = [
        *serve_argv(port),
        "--max-total-tokens",
        "4096",
        "--context-length",
        "1024",
        "--log-level",
        "warning",
    ]
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(url, proc, timeout_s=300)
        except NotReady as exc:
            pytest.fail(f"{exc}: {(tmp_path / 'server.log').read_text()[-2000:]}")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


@pytest.mark.slow  # a `radixagent serve` subprocess loads the model
def test_sigterm_drains_in_flight_stream_and_exits_zero(served: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = served
    body = {
        "text": "Count slowly from one to one hundred:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
    }
    events: list[dict[str, Any]] = []
    done = False
    with httpx.Client(base_url=url, timeout=60) as client, client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            if line.strip() == "data: [DONE]":
                done = True
                break
            events.append(json.loads(line[5:]))
            if len(events) == 1:
                proc.send_signal(signal.SIGTERM)  # the request is in flight: it must be drained
    assert done, f"stream cut after {len(events)} chunks"
    assert events[-1]["meta_info"]["completion_tokens"] == 16
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert proc.wait(timeout=60) == 0
    with pytest.raises(httpx.TransportError):  # and it is gone: nothing listens any more
        httpx.get(f"{url}/health", timeout=2)
