"""docs/flow.md's counts, measured: the modules one real request crosses from `Agent.run`, and
from the chat route, down to the KV pool (runtime/cache/kv_pool.py).

A profiler records every call of the product's modules (agent/, runtime/) on every thread while
one request runs. The spine is the chain of modules on the stack where the request changes hands
(the route's call into the bridge, the client's `Scheduler.submit`) followed by the longest chain
in the scheduler's thread that reaches the pool's modules; a module is counted once however often
it appears. The HTTP spine is counted from the route's module: the app's middleware that wraps
every request (body limits, error shapes) sits above it and is reported apart.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
POOL = {"runtime.cache.kv_pool", "runtime.cache.seq_kv", "runtime.cache.request_kv"}
HANDOFFS = ("EngineBridge.generate", "Scheduler.submit")
LIMIT = 7  # modules, entry and pool included (the target; mini-sglang's scheduler side)


def _module(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] not in ("agent", "runtime"):
        return None
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Recorder:
    def __init__(self) -> None:
        self.entered: set[str] = set()
        self.handoffs: dict[str, list[str]] = {}
        self.pool: list[str] = []

    @staticmethod
    def chain(frame: FrameType | None) -> list[str]:
        out: list[str] = []
        while frame is not None:
            m = _module(frame.f_code.co_filename)
            if m and (not out or out[-1] != m):
                out.append(m)
            frame = frame.f_back
        return out[::-1]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        m = _module(frame.f_code.co_filename)
        if m is None:
            return
        self.entered.add(m)
        if frame.f_code.co_qualname in HANDOFFS:
            self.handoffs.setdefault(frame.f_code.co_qualname, self.chain(frame))
        elif m in POOL and len(chain := self.chain(frame)) > len(self.pool):
            self.pool = chain

    def spine(self) -> list[str]:
        order: list[str] = []
        for m in [*(m for h in HANDOFFS for m in self.handoffs.get(h, [])), *self.pool]:
            if m not in order:
                order.append(m)
        return order


def _record(engine: Any, fn: Callable[[], None]) -> Recorder:
    # the scheduler's thread leaves after a second idle: the next one starts under the profiler
    deadline = time.monotonic() + 10
    while (t := engine.scheduler.thread) is not None and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    rec = Recorder()
    threading.setprofile(rec)
    sys.setprofile(rec)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return rec


def _report(name: str, spine: list[str], rec: Recorder) -> None:
    print(f"\n{name}: {len(spine)} modules on the spine, {len(rec.entered)} entered: {' -> '.join(spine)}")


@pytest.mark.slow
def test_agent_run_reaches_the_pool_through_at_most_seven_modules(engine: Any) -> None:
    from agent import Agent, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = Agent(backend=engine, system="You add.", tools=[add], max_steps=1, sampling={"max_new_tokens": 4})
    rec = _record(engine, lambda: agent.run("What is 2 + 3?"))
    spine = rec.spine()
    _report("Agent.run", spine, rec)
    assert spine[0] == "agent.agent" and spine[-1] in POOL, spine
    assert "runtime.engine.scheduler" in spine and "runtime.cache.manager" in spine, spine
    assert len(spine) <= LIMIT, spine


@pytest.mark.slow
def test_the_chat_route_reaches_the_pool_through_at_most_seven_modules(engine: Any) -> None:
    from fastapi.testclient import TestClient

    from runtime.server.app import create_app

    app = create_app(engine)

    def chat() -> None:
        with TestClient(app) as client:
            body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text

    rec = _record(engine, chat)
    full = rec.spine()
    spine = full[full.index("runtime.server.openai_api") :]
    _report("POST /v1/chat/completions (from the route)", spine, rec)
    print(f"above the route, on every request: {full[: full.index('runtime.server.openai_api')]}")
    assert spine[-1] in POOL and "runtime.server.bridge" in spine, spine
    assert len(spine) <= LIMIT, spine
