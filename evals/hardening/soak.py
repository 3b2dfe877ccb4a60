"""Load and soak test of `radixagent serve` on loopback: N concurrent sessions for a fixed time.

    python -m evals.hardening.soak --sessions 32 --minutes 3 --out DIR

Starts the server as a subprocess (127.0.0.1, random free port, small KV pool, debug endpoints on),
drives N client sessions (mixed long and short prompts that extend a per-session history, streaming
and not, some clients hanging up mid-stream), samples the server's RSS, and at the end checks
`GET /debug/integrity` (no lock refs left, no leaked slots). Every loop is bounded by the deadline.
Writes results.json and rss.png into DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from runtime.server.cli import serve_argv
from runtime.server.ready import wait_ready

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "maple",
    "cedar",
    "orbit",
    "pixel",
    "lantern",
    "harbor",
    "quartz",
]


@dataclass(frozen=True, slots=True)
class SoakConfig:
    sessions: int = 32
    seconds: float = 180.0
    max_total_tokens: int = 8192
    context_length: int = 1024
    max_queue: int = 64
    disconnect_rate: float = 0.15
    stream_rate: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.seconds <= 0:
            raise ValueError("sessions must be >= 1 and seconds > 0")


@dataclass(slots=True)
class Outcome:
    kind: str  # answered | rejected_503 | disconnected | other
    status: int | None
    latency_s: float
    completion_tokens: int = 0
    detail: str = ""


@dataclass(slots=True)
class Soak:
    config: SoakConfig
    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(config: SoakConfig, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [
        *serve_argv(port),
        "--max-total-tokens",
        str(config.max_total_tokens),
        "--context-length",
        str(config.context_length),
        "--max-queue",
        str(config.max_queue),
        "--enable-debug-endpoints",
        "--log-level",
        "warning",
    ]
    return subprocess.Popen(cmd, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)


def prompt_for(session: int, turn: int, long: bool) -> str:
    """A per-session head (long: ~300 words, short: ~20) plus this turn's question: turns of one
    session share the head, so the cache has prefixes to hit, and 32 long heads overflow the pool."""
    rng = random.Random(session * 2 + long)
    head = f"Session {session} notes. " + " ".join(rng.choice(WORDS) for _ in range(300 if long else 20))
    return f"{head}\nTurn {turn}: summarize the notes in one word:"


async def one_request(
    client: httpx.AsyncClient, soak: Soak, rng: random.Random, session: int, turn: int
) -> None:
    cfg = soak.config
    long = rng.random() < 0.4
    stream, hang_up = rng.random() < cfg.stream_rate, rng.random() < cfg.disconnect_rate
    max_new = 32 if hang_up else rng.choice((4, 8, 16))
    body = {
        "text": prompt_for(session, turn, long),
        "stream": stream or hang_up,
        "session_id": f"soak-{session}",
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0.7, "ignore_eos": True},
    }
    started = time.perf_counter()
    try:
        if body["stream"]:
            outcome = await _streamed(client, body, hang_up, started)
        else:
            r = await client.post("/generate", json=body)
            outcome = _classify(r.status_code, time.perf_counter() - started, r.json() if r.content else {})
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome = Outcome("other", None, time.perf_counter() - started, detail=f"{type(exc).__name__}: {exc}")
    soak.outcomes.append(outcome)


async def _streamed(
    client: httpx.AsyncClient, body: dict[str, Any], hang_up: bool, started: float
) -> Outcome:
    last: dict[str, Any] = {}
    async with client.stream("POST", "/generate", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return _classify(r.status_code, time.perf_counter() - started, r.json())
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            last = json.loads(line[5:])
            if "error" in last:
                return Outcome("other", 200, time.perf_counter() - started, detail=str(last["error"])[:200])
            if hang_up:  # leave after the first chunk: the server must abort and release the locks
                return Outcome("disconnected", 200, time.perf_counter() - started)
    return _classify(200, time.perf_counter() - started, last)


def _classify(status: int, latency: float, body: dict[str, Any]) -> Outcome:
    if status == 200:
        tokens = int(body.get("meta_info", {}).get("completion_tokens", 0))
        return Outcome("answered", status, latency, tokens)
    kind = "rejected_503" if status == 503 else "other"
    return Outcome(kind, status, latency, detail=json.dumps(body)[:200])


async def session_loop(soak: Soak, session: int, deadline: float) -> None:
    rng = random.Random(soak.config.seed * 7919 + session)
    async with httpx.AsyncClient(base_url=soak.url, timeout=120) as client:
        turn = 0
        while time.monotonic() < deadline:
            await one_request(client, soak, rng, session, turn)
            turn += 1


async def sample_rss(soak: Soak, pid: int, deadline: float, period_s: float = 0.5) -> None:
    proc, t0 = psutil.Process(pid), time.monotonic()
    while time.monotonic() < deadline:
        soak.rss.append((time.monotonic() - t0, proc.memory_info().rss))
        await asyncio.sleep(period_s)


async def drive(soak: Soak, pid: int) -> float:
    started = time.monotonic()
    deadline = started + soak.config.seconds
    tasks = [session_loop(soak, i, deadline) for i in range(soak.config.sessions)]
    await asyncio.gather(sample_rss(soak, pid, deadline + 2.0), *tasks)
    return time.monotonic() - started


def wait_idle(url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    report: dict[str, Any] = {}
    while time.monotonic() < deadline:
        report = httpx.get(f"{url}/debug/integrity", timeout=30).json()
        if report["running"] == 0 and report["queue_depth"] == 0:
            return report
        time.sleep(0.2)
    return report


def summarize(soak: Soak, wall_s: float, integrity: dict[str, Any], pool_bytes: int) -> dict[str, Any]:
    kinds = {
        k: sum(o.kind == k for o in soak.outcomes)
        for k in ("answered", "rejected_503", "disconnected", "other")
    }
    answered = [o for o in soak.outcomes if o.kind == "answered"]
    lat = sorted(o.latency_s for o in answered)
    mib = [r / 2**20 for _, r in soak.rss]
    third = max(1, len(mib) // 3)
    return {
        "config": asdict(soak.config),
        "requests": len(soak.outcomes),
        **kinds,
        "other_details": sorted({o.detail or str(o.status) for o in soak.outcomes if o.kind == "other"})[:10],
        "wall_s": round(wall_s, 2),
        "throughput_rps": round(len(answered) / wall_s, 3),
        "tokens_per_s": round(sum(o.completion_tokens for o in answered) / wall_s, 2),
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3) if lat else None,
        "rss_start_mib": round(mib[0], 1) if mib else None,
        "rss_max_mib": round(max(mib), 1) if mib else None,
        "rss_end_mib": round(mib[-1], 1) if mib else None,
        "rss_growth_last_third_mib": round(max(mib[-third:]) - max(mib[third:-third] or mib[:third]), 1)
        if mib
        else None,
        "pool_capacity_mib": round(pool_bytes / 2**20, 1),
        "integrity": integrity,
        "leaked_locks": integrity.get("lock_refs"),
        "ok": bool(integrity.get("ok")) and integrity.get("lock_refs") == 0 and kinds["other"] == 0,
    }


def plot(soak: Soak, pool_bytes: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t for t, _ in soak.rss], [r / 2**20 for _, r in soak.rss], label="server RSS")
    if soak.rss:
        base = soak.rss[0][1] / 2**20
        ax.axhline(base, color="gray", linestyle=":", label="RSS at start (pool preallocated)")
        ax.axhline(pool_bytes / 2**20, color="red", linestyle="--", label="KV pool capacity")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(f"radixagent serve under {soak.config.sessions} sessions")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(config: SoakConfig, out: Path) -> dict[str, Any]:
    """Start the server, soak it, check it, stop it (SIGTERM); results.json and rss.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    soak = Soak(config, f"http://127.0.0.1:{port}")
    proc = start_server(config, port, out / "server.log")
    try:
        wait_ready(soak.url, proc)
        pool_bytes = int(
            httpx.get(f"{soak.url}/get_server_info", timeout=30).json()["cache_stats"]["pool_capacity_bytes"]
        )
        wall = asyncio.run(drive(soak, proc.pid))
        integrity = wait_idle(soak.url)
        results = summarize(soak, wall, integrity, pool_bytes)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            results_exit = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            results_exit = None
    results["server_exit_code"] = results_exit
    (out / "results.json").write_text(json.dumps(results, indent=2))
    plot(soak, pool_bytes, out / "rss.png")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.hardening.soak", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--max-total-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out/soak"))
    ns = p.parse_args(argv)
    config = SoakConfig(
        sessions=ns.sessions, seconds=ns.minutes * 60, max_total_tokens=ns.max_total_tokens, seed=ns.seed
    )
    results = run(config, ns.out)
    keys = (
        "requests",
        "answered",
        "rejected_503",
        "disconnected",
        "other",
        "throughput_rps",
        "latency_p95_s",
        "rss_max_mib",
        "rss_growth_last_third_mib",
        "pool_capacity_mib",
        "leaked_locks",
        "ok",
    )
    print(json.dumps({k: results[k] for k in keys}, indent=2))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
