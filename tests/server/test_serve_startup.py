"""`radixagent serve` start-up: a busy port is reported before the model loads, --help documents
the common flags with their defaults."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from runtime.server.args import build_parser
from runtime.server.cli import serve_argv


def test_busy_port_fails_fast_before_loading() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        started = time.monotonic()
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        proc = subprocess.run(serve_argv(port), capture_output=True, text=True, timeout=120, env=env)
        elapsed = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "loading" not in proc.stderr
    assert elapsed < 30  # the model (30-46 s on a 2-core box) was never loaded


def test_help_names_the_common_flags_with_defaults() -> None:
    text = build_parser().format_help()
    for flag, default in (("--host", "127.0.0.1"), ("--port", "30000"), ("--device", "cpu")):
        start = text.index(f"\n  {flag} ")  # the option's entry, not the usage line
        entry = " ".join(text[start : start + 400].split())  # help text is wrapped
        assert f"(default: {default})" in entry, flag
    assert "--context-length" in text and "longest prompt" in text
