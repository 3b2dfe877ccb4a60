"""The one serve-and-wait helper (runtime/server/ready.py): ready, exited, or out of time."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runtime.server.ready import NotReady, wait_ready


class _Health(BaseHTTPRequestHandler):
    calls = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).calls += 1
        ok = self.path == "/health" and type(self).calls >= 3  # "starting" twice, then up
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    _Health.calls = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_waits_until_the_server_says_ready(server: str) -> None:
    wait_ready(server, timeout_s=10)
    assert _Health.calls == 3


def test_an_exited_process_is_named() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(NotReady, match="exited with 3"):
        wait_ready("http://127.0.0.1:9", proc, timeout_s=10)


def test_a_deadline_is_kept(server: str) -> None:
    with pytest.raises(NotReady, match="not ready at /other"):
        wait_ready(server, path="/other", timeout_s=0.3)
