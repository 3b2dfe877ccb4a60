"""Injected causes through `radixagent serve --trace-dir`, driven by the `openai` client: the
trace the server writes is read back and checked step by step.

Each session names itself one of three ways in turn (`prompt_cache_key`, an `X-Session-Id`
header, `session_id` in the body). Steps are prefill-only (`max_tokens=0`): an OpenAI
completion returns text, and a client that re-tokenized the output would itself change the
prompt (which the trace would rightly call a prompt change); token-id prompts that only grow keep
the run byte-stable. Kinds: prompt_change, cache_off, eviction (a second server over a small
pool) and the control; `namespace` cannot appear here by design (a trace is per salt, and a
session under another salt is another session: counting it would leak one tenant's prompts
into another's trace).
"""

from __future__ import annotations

import random
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.trace import read_trace
from evals.misses.common import TURN_TOKENS, Tally, expected_miss, random_ids
from runtime.trace.record import StepRecord

NAMINGS = ("prompt_cache_key", "header", "session_id")


class LiveServer:
    """The app on 127.0.0.1 (a free port), uvicorn in a thread, for the length of a `with`."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK waits
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def _request(client: Any, ids: list[int], session: str, naming: str, **extra: Any) -> Any:
    body: dict[str, Any] = dict(extra)
    headers: dict[str, str] = {}
    if naming == "prompt_cache_key":
        body["prompt_cache_key"] = session
    elif naming == "header":
        headers["X-Session-Id"] = session
    else:
        body["session_id"] = session
    return client.completions.create(
        model="default", prompt=ids, max_tokens=0, temperature=0.0, extra_body=body, extra_headers=headers
    )


def _session(client: Any, small: Any, kind: str, index: int, seed: int) -> dict[str, Any]:
    """Three steps: a head, a byte-stable extension (control), then the injected step."""
    rng = random.Random(f"{seed}-{kind}-{index}")  # distinct prompts per session
    name, naming = f"{kind}-{index}", NAMINGS[index % len(NAMINGS)]
    target = small if kind == "eviction" else client
    p0 = random_ids(rng, rng.randrange(8, 25))
    p1 = p0 + random_ids(rng, TURN_TOKENS)
    _request(target, p0, name, naming)
    _request(target, p1, name, naming)
    offset = None
    if kind == "prompt_change":
        offset = rng.randrange(1, len(p1) - 1)
        p2 = list(p1)
        p2[offset] += 1
        p2 += random_ids(rng, TURN_TOKENS)
    else:
        p2 = p1 + random_ids(rng, TURN_TOKENS)
    if kind == "eviction":  # another tenant's fillers push the session out of the small pool
        for _ in range(2):
            target.completions.create(
                model="default",
                prompt=random_ids(rng, 300),
                max_tokens=0,
                extra_body={"cache_salt": f"filler-{index}"},
            )
    _request(target, p2, name, naming, prefix_cache=kind != "cache_off")
    return {"name": name, "kind": kind, "p0": len(p0), "p1": len(p1), "p2": len(p2), "offset": offset}


def check(records: list[StepRecord], spec: dict[str, Any], tally: Tally) -> None:
    steps = sorted((r for r in records if r.session_id == spec["name"]), key=lambda r: r.step)
    if len(steps) != 3:
        tally.add(spec["kind"], {"steps": 3}, {"steps": len(steps)}, spec["name"])
        return
    _, control, injected = steps
    tally.add(
        "control",
        expected_miss("control", spec["p0"], spec["p1"], control.cached_tokens, output=False),
        control.miss,
        spec["name"],
    )
    expected = expected_miss(
        spec["kind"], spec["p1"], spec["p2"], injected.cached_tokens, spec["offset"], False
    )
    if spec["kind"] == "prompt_change" and (injected.prefix_break or {}).get("offset") != spec["offset"]:
        expected = {"prefix_break_offset": spec["offset"]}
    kind = spec["kind"]
    if kind == "eviction" and injected.cached_tokens >= spec["p1"]:
        kind = "eviction (none happened)"
    tally.add(kind, expected, injected.miss, spec["name"])


def run(engines: dict[str, Any], per_kind: int, seed: int) -> Tally:
    """`per_kind` sessions of each kind through two live servers with `--trace-dir`."""
    import openai

    from runtime.server import ServerArgs, create_app

    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / "main", Path(tmp) / "small"]
        apps = [
            create_app(engines[k], ServerArgs(trace_dir=str(d)))
            for k, d in zip(("main", "small"), dirs, strict=True)
        ]
        with LiveServer(apps[0]) as main, LiveServer(apps[1]) as small:
            clients = [
                openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0) for s in (main, small)
            ]
            jobs = [(kind, i) for kind in ("prompt_change", "cache_off", "eviction") for i in range(per_kind)]
            with ThreadPoolExecutor(max_workers=4) as pool:
                specs = list(pool.map(lambda j: _session(clients[0], clients[1], j[0], j[1], seed), jobs))
        records = []
        for d in dirs:
            for path in sorted(d.glob("*.jsonl")):
                records += read_trace(path)
    for spec in specs:
        check(records, spec, tally)
    return tally
