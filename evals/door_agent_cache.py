"""A 6-call tool agent through each front door: per-call prefix-cache hits and TTFT cached vs not.

    python -m evals.door_agent_cache [--url http://127.0.0.1:PORT] [--turns 6] [--out docs/benchmarks-doors.md]

Without --url it starts `radixagent serve` (127.0.0.1, a free port) and stops it at the end. Doors:
the OpenAI Agents SDK's default model class (`/v1/responses`), the `anthropic` client
(`/v1/messages`) and the `openai` client's chat completions (`/v1/chat/completions`, the reference).
Each runs the same two-tool agent (evals/doors/); the tools really run. Per call: prompt tokens, the
part read from the prefix cache, the hit rate (target >= 90% from call 2). Then the last call's body
is sent again, streamed, 3 times as is (its prefix cached) and 3 times with `prefix_cache: false`
(the same engine, no reuse): median time to the first output event, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from evals.doors import anthropic_agent, chat_agent, responses_agent
from evals.tool_agent_cache import _free_port, start_server

#: (door, path, the event that carries the first output, the transcript runner, its replay body)
DOORS: list[tuple[str, str, Callable[..., Any], Callable[..., dict[str, Any]]]] = [
    (
        "Agents SDK default (responses)",
        "/v1/responses",
        responses_agent.agents_transcript,
        responses_agent.last_request,
    ),
    (
        "anthropic client (messages)",
        "/v1/messages",
        anthropic_agent.anthropic_transcript,
        anthropic_agent.last_request,
    ),
    (
        "chat completions (reference)",
        "/v1/chat/completions",
        chat_agent.chat_transcript,
        chat_agent.last_request,
    ),
]
_FIRST_OUTPUT = (
    '"response.output_text.delta"',
    '"response.function_call_arguments.delta"',
    '"content_block_delta"',
    '"delta": {"content"',
    '"delta":{"content"',
    '"tool_calls"',
)


def ttft(url: str, body: dict[str, Any]) -> float:
    """Seconds from sending a streamed request to the first line that carries output."""
    start = time.perf_counter()
    with httpx.stream("POST", url, json=dict(body, stream=True), timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:") and any(mark in line for mark in _FIRST_OUTPUT):
                elapsed = time.perf_counter() - start
                break
        else:
            raise RuntimeError(f"{url}: the stream carried no output")
        for _ in r.iter_lines():  # drain so the next request starts on an idle engine
            pass
    return elapsed


def measure_door(
    base: str, door: tuple[str, str, Callable[..., Any], Callable[..., Any]], turns: int, rounds: int
) -> dict[str, Any]:
    name, path, transcript, last = door
    rows, sent = transcript(base, turns=turns)
    body = last(sent)
    cached = [ttft(base + path, body) for _ in range(rounds)]
    uncached = [ttft(base + path, dict(body, prefix_cache=False)) for _ in range(rounds)]
    later = rows[1:]
    share = sum(r["cached_tokens"] for r in later) / max(1, sum(r["prompt_tokens"] for r in later))
    return {
        "door": name,
        "path": path,
        "rows": rows,
        "hit_rate_from_call_2": round(share, 4),
        "min_hit_rate_from_call_2": round(min((r["hit_rate"] for r in later), default=0.0), 4),
        "ttft_cached_s": round(statistics.median(cached), 4),
        "ttft_uncached_s": round(statistics.median(uncached), 4),
        "last_prompt_tokens": rows[-1]["prompt_tokens"] if rows else 0,
    }


def markdown(results: list[dict[str, Any]], cpu: str) -> str:
    turns = max(len(r["rows"]) for r in results)
    lines = [
        "# Front doors: a tool agent's prefix reuse per call (`python -m evals.door_agent_cache`)",
        "",
        f"Measured on: {cpu}; SmolLM2-135M-Instruct, the default engine configuration; one run.",
        "",
        "Summary: "
        + "; ".join(
            f"{r['door']}: {r['hit_rate_from_call_2']:.1%} of the prompt cached from call 2 (lowest call "
            f"{r['min_hit_rate_from_call_2']:.1%}), TTFT {r['ttft_uncached_s'] / r['ttft_cached_s']:.1f}x faster cached"
            for r in results
        ),
        "",
        "## Cached share of each call's prompt (cached / prompt tokens)",
        "",
        "| door | " + " | ".join(f"call {i + 1}" for i in range(turns)) + " |",
        "|---|" + "---|" * turns,
    ]
    for r in results:
        cells = [
            f"{row['hit_rate']:.1%} ({row['cached_tokens']}/{row['prompt_tokens']})" for row in r["rows"]
        ]
        lines.append(f"| {r['door']} | " + " | ".join(cells + ["-"] * (turns - len(cells))) + " |")
    lines += [
        "",
        "## Time to first output of the last call, streamed (median of 3)",
        "",
        "| door | prompt tokens | cached | `prefix_cache: false` | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r["ttft_uncached_s"] / r["ttft_cached_s"]
        lines.append(
            f"| {r['door']} | {r['last_prompt_tokens']} | {r['ttft_cached_s'] * 1000:.0f} ms | "
            f"{r['ttft_uncached_s'] * 1000:.0f} ms | {ratio:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.door_agent_cache", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: start radixagent serve)")
    p.add_argument("--turns", type=int, default=6, help="model calls per agent")
    p.add_argument("--rounds", type=int, default=3, help="TTFT samples per setting")
    p.add_argument("--max-total-tokens", type=int, default=20000)
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks-doors.md"))
    args = p.parse_args(argv)
    proc, url = None, args.url
    if url is None:
        port = _free_port()
        proc, url = start_server(port, args.max_total_tokens), f"http://127.0.0.1:{port}"
    try:
        results = [measure_door(url.rstrip("/"), door, args.turns, args.rounds) for door in DOORS]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    text = markdown(results, _cpu())
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
