"""A 6-call tool agent through each front door: per-call prefix-cache hits and TTFT cached vs not.

    python -m evals.benchmarks.door_agent_cache [--url http://127.0.0.1:PORT] [--turns 6] [--out docs/results/bench-doors.md]

Without --url it starts `radixagent serve` (127.0.0.1, a free port) and stops it at the end. Doors:
the OpenAI Agents SDK's default model class (`/v1/responses`), the `anthropic` client
(`/v1/messages`) and the `openai` client's chat completions (`/v1/chat/completions`, the reference).
Each runs the same two-tool agent (evals/benchmarks/doors/); the tools really run. Per call: prompt tokens, the
part read from the prefix cache, the hit rate (target >= 90% from call 2) and, from the server's
`--trace-dir` (started by the benchmark), the ideal. Then the last call's body is sent again with one
output token, 3 times as is (its prefix cached) and 3 times with `prefix_cache: false` (the same
engine, no reuse): the median time to the first token, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from evals.benchmarks.bench_measure import cpu_name
from evals.benchmarks.doors import anthropic_agent, chat_agent, responses_agent
from evals.benchmarks.tool_agent_cache import _free_port, start_server

#: (door, path, the transcript runner, its replay body, the body's output-length field)
DOORS: list[tuple[str, str, Callable[..., Any], Callable[..., dict[str, Any]], str]] = [
    (
        "Agents SDK default (responses)",
        "/v1/responses",
        responses_agent.agents_transcript,
        responses_agent.last_request,
        "max_output_tokens",
    ),
    (
        "anthropic client (messages)",
        "/v1/messages",
        anthropic_agent.anthropic_transcript,
        anthropic_agent.last_request,
        "max_tokens",
    ),
    (
        "chat completions (reference)",
        "/v1/chat/completions",
        chat_agent.chat_transcript,
        chat_agent.last_request,
        "max_tokens",
    ),
]


def ttft(url: str, body: dict[str, Any]) -> float:
    """Seconds for the request with one output token: prefill plus one step, whatever the door's
    stream holds back (a tool call's first event waits for its name, some ten tokens)."""
    start = time.perf_counter()
    r = httpx.post(url, json=dict(body, stream=False), timeout=600)
    r.raise_for_status()
    return time.perf_counter() - start


def measure_door(
    base: str, door: tuple[str, str, Callable[..., Any], Callable[..., Any], str], turns: int, rounds: int
) -> dict[str, Any]:
    name, path, transcript, last, length_field = door
    rows, sent = transcript(base, turns=turns, session=session_of(name))
    body = dict(last(sent), **{length_field: 1})
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


def session_of(door: str) -> str:
    return "door-" + door.split(" ")[0].lower()


def add_ideal(results: list[dict[str, Any]], trace: Path) -> None:  # trace: the --trace-dir
    """Each call's ideal cached tokens and miss causes from the server's --trace-dir (what an
    unbounded cache would have served: the longest prefix of any earlier prompt+output)."""
    steps: dict[str, list[dict[str, Any]]] = {}
    # one file per tenant: the Messages door keeps each API key's cache (and trace) apart
    # lines split at "\n" only (agent.trace.read_trace says why)
    for line in (ln for f in sorted(trace.glob("*.jsonl")) for ln in f.read_text().split("\n") if ln.strip()):
        rec = json.loads(line)
        steps.setdefault(rec["session_id"], []).append(rec)
    for r in results:
        recs = steps.get(session_of(r["door"]), [])
        for row, rec in zip(r["rows"], recs, strict=False):  # the TTFT replays come after
            row["ideal_cached_tokens"] = rec["ideal_cached_tokens"]
            row["miss"] = rec["miss"]


def markdown(results: list[dict[str, Any]], cpu: str) -> str:
    turns = max(len(r["rows"]) for r in results)
    lines = [
        "# Front doors: a tool agent's prefix reuse per call (`python -m evals.benchmarks.door_agent_cache`)",
        "",
        f"Measured on: {cpu}; SmolLM2-135M-Instruct, the default engine configuration "
        "(`radixagent serve`, float32 weights); one run. Each door runs the same agent: the system "
        "prompt of evals/benchmarks/doors/anthropic_agent.py (standing rules, as agent frameworks send on every "
        "call), two tools that really run, tool use forced on every call.",
        "",
        "Summary: "
        + "; ".join(
            f"{r['door']}: {r['hit_rate_from_call_2']:.1%} of the prompt cached from call 2 (lowest call "
            f"{r['min_hit_rate_from_call_2']:.1%}), time to first token "
            f"{r['ttft_uncached_s'] / r['ttft_cached_s']:.1f}x faster cached"
            for r in results
        ),
        "",
        "## Cached share of each call's prompt (cached / prompt tokens)",
        "",
        "`ideal`: what an unbounded cache could have served (the longest prefix of any earlier "
        "prompt+output of the conversation, from the server's `--trace-dir`); every token under it "
        "is a miss of the cache, every token above it is new to the conversation. The doors render "
        "the same system prompt and tools to the same tokens, so a door's first call reads the head "
        "an earlier door left (cached above its conversation's ideal of 0).",
        "",
        "| door | " + " | ".join(f"call {i + 1}" for i in range(turns)) + " |",
        "|---|" + "---|" * turns,
    ]
    for r in results:
        cells = [_cell(row) for row in r["rows"]]
        lines.append(f"| {r['door']} | " + " | ".join(cells + ["-"] * (turns - len(cells))) + " |")
    lines += [
        "",
        "## Time to first token of the last call (median of 3)",
        "",
        "The last call's body sent again with one output token (prefill plus one step), as is (its "
        "prefix cached) and with `prefix_cache: false` (the same engine, no reuse).",
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


def _cell(row: dict[str, Any]) -> str:
    text = f"{row['hit_rate']:.1%} ({row['cached_tokens']}/{row['prompt_tokens']}"
    if "ideal_cached_tokens" in row:
        text += f", ideal {row['ideal_cached_tokens']}"
    return text + ")"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.door_agent_cache", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", default=None, help="a running server (default: start radixagent serve)")
    p.add_argument("--turns", type=int, default=6, help="model calls per agent")
    p.add_argument("--rounds", type=int, default=3, help="TTFT samples per setting")
    p.add_argument("--max-total-tokens", type=int, default=20000)
    p.add_argument("--out", type=Path, default=Path("docs/results/bench-doors.md"))
    args = p.parse_args(argv)
    proc, url = None, args.url
    with tempfile.TemporaryDirectory() as trace_dir:
        if url is None:
            port = _free_port()
            proc = start_server(port, args.max_total_tokens, "--trace-dir", trace_dir)
            url = f"http://127.0.0.1:{port}"
        try:
            results = [measure_door(url.rstrip("/"), door, args.turns, args.rounds) for door in DOORS]
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        add_ideal(results, Path(trace_dir))
    text = markdown(results, cpu_name())
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
