"""Start a private redis-server on loopback (random port, temp dir) for tests; skip without one."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

INSTALL_HINT = (
    "redis-server not found: install it (Debian: apt-get install -y redis-server) to run Redis tier tests"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process; `stop`/`start` simulate Redis going down and coming back."""

    def __init__(self, workdir: Path, port: int | None = None, maxmemory: str = "256mb") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip(INSTALL_HINT)
        pytest.importorskip("redis", reason="the redis client is missing: pip install 'radixagent[tier]'")
        self.binary, self.workdir, self.maxmemory = binary, workdir, maxmemory
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            self.maxmemory,
            "--maxmemory-policy",
            "allkeys-lru",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.skip(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


def running_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """Body of a test module's `redis_server` fixture (tests/tier has no conftest.py: other
    directories' tests import their own `conftest` by that module name)."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
