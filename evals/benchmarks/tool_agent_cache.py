"""Per-call prefix-cache hits of a tool-using OpenAI Agents SDK conversation against a server.

    python -m evals.benchmarks.tool_agent_cache [--url http://127.0.0.1:PORT] [--calls 5] [--out DIR]

Without --url it starts `radixagent serve` (127.0.0.1, random free port, small KV pool) and stops it
at the end. One `Agent` (two `function_tool`s, tool use forced on each question's first call, the
SDK resets it to auto after a tool ran) answers questions in one conversation until `--calls` model
calls were made. Prints, per model call: prompt tokens, cached tokens, hit rate, and the share of the
previous call's prompt that was served from the cache; writes results.json into DIR when given.
Tracing is off: nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from runtime.server.cli import serve_argv
from runtime.server.ready import NotReady, wait_ready

QUESTIONS = [
    "What is the weather in Oslo?",
    "And what is the weather in Rome?",
    "Convert 20 degrees Celsius to Fahrenheit.",
    "What is the weather in Lima?",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, max_total_tokens: int, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [
        *serve_argv(port),
        "--max-total-tokens",
        str(max_total_tokens),
        "--log-level",
        "warning",
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout_s=600)
    except NotReady:
        proc.terminate()
        raise
    return proc


def run_conversation(url: str, calls: int, max_tokens: int) -> list[dict[str, Any]]:
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"{city}: 18 degrees Celsius, light wind."

    @function_tool
    def celsius_to_fahrenheit(celsius: float) -> str:
        """Convert a temperature from Celsius to Fahrenheit."""
        return f"{celsius * 9 / 5 + 32:.1f} F"

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    agent = Agent(
        name="assistant",
        instructions="You answer with the tools: get_weather for weather, celsius_to_fahrenheit for conversions.",
        tools=[get_weather, celsius_to_fahrenheit],
        model=OpenAIChatCompletionsModel(model="default", openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=max_tokens
        ),
    )
    rows: list[dict[str, Any]] = []
    history: list[Any] = []
    for question in QUESTIONS:
        result = Runner.run_sync(agent, [*history, {"role": "user", "content": question}], max_turns=3)
        for response in result.raw_responses:
            usage = response.usage
            rows.append(
                {
                    "question": question,
                    "prompt_tokens": usage.input_tokens,
                    "cached_tokens": usage.input_tokens_details.cached_tokens,
                    "completion_tokens": usage.output_tokens,
                }
            )
        history = result.to_input_list()
        if len(rows) >= calls:
            break
    for i, row in enumerate(rows):
        row["call"] = i + 1
        row["hit_rate"] = round(row["cached_tokens"] / row["prompt_tokens"], 4)
        prev = rows[i - 1]["prompt_tokens"] if i else None
        row["of_previous_prompt"] = round(row["cached_tokens"] / prev, 4) if prev else None
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.tool_agent_cache", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", default=None, help="a running server (default: start radixagent serve)")
    p.add_argument("--calls", type=int, default=5, help="model calls to make (at least)")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--max-total-tokens", type=int, default=20000)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    proc, url = None, args.url
    if url is None:
        port = _free_port()
        proc, url = start_server(port, args.max_total_tokens), f"http://127.0.0.1:{port}"
    try:
        rows = run_conversation(url.rstrip("/"), args.calls, args.max_tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"{'call':>4} {'prompt':>7} {'cached':>7} {'hit':>7} {'of prev':>8}  question")
    for r in rows:
        prev = f"{r['of_previous_prompt']:.1%}" if r["of_previous_prompt"] is not None else "-"
        print(
            f"{r['call']:>4} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} {r['hit_rate']:>7.1%} {prev:>8}  "
            f"{r['question']}"
        )
    total = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    later = rows[1:]
    summary = {
        "calls": len(rows),
        "prompt_tokens": total,
        "cached_tokens": cached,
        "hit_rate": round(cached / total, 4) if total else 0.0,
        "hit_rate_from_call_2": round(
            sum(r["cached_tokens"] for r in later) / max(1, sum(r["prompt_tokens"] for r in later)), 4
        ),
    }
    print(json.dumps(summary))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
