"""Issue 39, class 7: /update_weights_from_disk reads headers before anything big, answers every
unusable path alike (no oracle for which files exist), runs one swap at a time (409 for the
second) and holds new requests for a bounded time only."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from runtime.model import files as model_files
from runtime.model.weights import NOT_LOADABLE
from runtime.server import ServerArgs, create_app
from tests.support.server_util import LiveServer, wait_idle

pytestmark = pytest.mark.slow
BIG = 64 * 2**20


@pytest.fixture(scope="module")
def live(engine: Any) -> Iterator[tuple[LiveServer, Any]]:
    sibling = engine.sibling(max_total_tokens=4096)
    with LiveServer(create_app(sibling, ServerArgs(weights_swap_wait_s=1.0))) as server:
        yield server, sibling
    sibling.shutdown()


def _swap(server: LiveServer, path: str, timeout: float = 300) -> httpx.Response:
    return httpx.post(f"{server.url}/update_weights_from_disk", json={"model_path": path}, timeout=timeout)


def _unusable(root: Path) -> dict[str, str]:
    """Paths that hold no usable model, each wrong in another way."""
    root.mkdir(exist_ok=True)
    random_gguf, random_file = root / "random.gguf", root / "random.bin"
    for path in (random_gguf, random_file):
        with open(path, "wb") as f:
            f.write(os.urandom(BIG))
    (root / "empty-dir").mkdir(exist_ok=True)
    fake = root / "huge-header"  # config of the served model, a safetensors file claiming a 1 TB header
    fake.mkdir(exist_ok=True)
    real = Path(model_files.default_model_path()).parent
    config = next(real.glob("config.json"), None)
    if config is not None:
        shutil.copy(config, fake / "config.json")
    else:
        (fake / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with open(fake / "model.safetensors", "wb") as f:
        f.write((2**40).to_bytes(8, "little") + os.urandom(1024))
    other = root / "other-arch"
    other.mkdir(exist_ok=True)
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return {
        "missing": str(root / "no-such-model"),
        "missing.gguf": str(root / "no-such-model.gguf"),
        "random.gguf": str(random_gguf),
        "random file": str(random_file),
        "folder without config": str(root / "empty-dir"),
        "huge safetensors header": str(fake),
        "other architecture": str(other),
        "a device": "/dev/zero",
    }


def test_unusable_paths_get_one_answer_and_cost_no_memory(live: Any, tmp_path: Path) -> None:
    server, sibling = live
    process = psutil.Process()
    answers = {}
    for name, path in _unusable(tmp_path).items():
        before = process.memory_info().rss
        r = _swap(server, path, timeout=60)
        grew = process.memory_info().rss - before
        assert r.status_code == 400, (name, r.text)
        answers[name] = r.json()["message"]
        assert grew < BIG // 2, f"{name}: RSS grew {grew / 2**20:.0f} MiB"  # headers only
    assert set(answers.values()) == {f"Failed to update weights: {NOT_LOADABLE}"}, answers
    sibling.check_integrity()


def test_a_second_concurrent_swap_is_a_409(live: Any) -> None:
    server, sibling = live
    assert sibling._swap_lock.acquire(blocking=False)  # a swap in progress
    try:
        r = _swap(server, model_files.default_model_path(), timeout=60)
    finally:
        sibling._swap_lock.release()
    assert r.status_code == 409 and "already in progress" in r.json()["message"]


def test_running_requests_hold_a_swap_for_the_bound_only(live: Any) -> None:
    """A long request outlasts --weights-swap-wait-s (1 s here): the swap fails with 409 and the
    weights stay; requests sent meanwhile were held at most that long."""
    server, sibling = live
    body = {
        "text": "Count slowly from one to a thousand:",
        "sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True},
    }
    version = sibling.weights_version
    long_done: list[httpx.Response] = []
    runner = threading.Thread(
        target=lambda: long_done.append(httpx.post(f"{server.url}/generate", json=body, timeout=600))
    )
    runner.start()
    time.sleep(1.0)
    swap: list[httpx.Response] = []
    swapper = threading.Thread(target=lambda: swap.append(_swap(server, model_files.default_model_path())))
    swapper.start()
    swapper.join(timeout=300)
    assert swap and swap[0].status_code == 409, swap[0].text if swap else "no answer"
    assert "--weights-swap-wait-s" in swap[0].json()["message"] and sibling.weights_version == version
    started = time.monotonic()
    short = {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    assert httpx.post(f"{server.url}/generate", json=short, timeout=120).status_code == 200
    assert time.monotonic() - started < 60  # not held behind the long request any more
    httpx.post(f"{server.url}/abort_request", json={"abort_all": True}, timeout=30)
    runner.join(timeout=600)
    wait_idle(sibling, timeout_s=120)
    sibling.check_integrity()
