"""One agent workload against any SGLang-compatible server, for comparing eviction set-ups of
SGLang itself (`tests/sglang/run.sh --bench`: no plugin, SGLang's session radix cache alone, ours).

Deterministic: a shared system prefix, then sessions that each read a document of their own and
take steps (a tool result appended, the model's output kept in the context, as an agent does),
a few sessions live at a time, each closed (`/close_session`) when done; session-less one-off
requests add pressure. Token ids are sent as `input_ids` (no tokenizer in the loop); outputs are
greedy, so every set-up sees the same prompts.

Per set-up: prompt tokens, cached tokens (the server's `meta_info.cached_tokens`), hit rate, and
recomputed tokens = what an unbounded cache would have served (the longest prefix shared with an
earlier request's prompt + output) minus what was served.

    python -m evals.eviction.sglang_sessions --url http://127.0.0.1:30000 --label lru --out results.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class Workload:
    sessions: int = 8
    live: int = 3  # sessions open at once
    steps: int = 4
    system_tokens: int = 64
    doc_tokens: int = 160
    tool_tokens: int = 40
    output_tokens: int = 4
    noise_every: int = 3  # a session-less one-off request after every N session steps
    noise_tokens: int = 200
    seed: int = 0


@dataclass(slots=True)
class Tally:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ideal_cached_tokens: int = 0
    seen: list[list[int]] = field(default_factory=list)

    def add(self, prompt: Sequence[int], output: Sequence[int], cached: int) -> None:
        ideal = max((_common(prompt, s) for s in self.seen), default=0)
        self.requests += 1
        self.prompt_tokens += len(prompt)
        self.cached_tokens += cached
        self.ideal_cached_tokens += min(ideal, len(prompt) - 1)  # the last token is always computed
        self.seen.append([*prompt, *output])

    def row(self, label: str, seconds: float) -> dict[str, Any]:
        return {
            "setup": label,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
            "recomputed_tokens": max(0, self.ideal_cached_tokens - self.cached_tokens),
            "ideal_cached_tokens": self.ideal_cached_tokens,
            "seconds": round(seconds, 1),
        }


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Runner:
    def __init__(self, url: str, w: Workload, timeout_s: float = 1800.0) -> None:
        self.client = httpx.Client(base_url=url, timeout=timeout_s)
        self.w = w
        self.rng = random.Random(w.seed)
        self.tally = Tally()

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(1000, 20000) for _ in range(n)]

    def generate(self, ids: list[int], session_id: str | None) -> list[int]:
        body: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": self.w.output_tokens, "temperature": 0},
        }
        if session_id is not None:
            body["session_id"] = session_id
        r = self.client.post("/generate", json=body)
        r.raise_for_status()
        out = r.json()
        output = list(out.get("output_ids") or [])
        self.tally.add(ids, output, int(out["meta_info"].get("cached_tokens") or 0))
        return output

    def run(self) -> Tally:
        w = self.w
        system = self._ids(w.system_tokens)
        waiting = [f"s{i}" for i in range(w.sessions)]
        contexts: dict[str, list[int]] = {}
        steps: dict[str, int] = {}
        done = 0
        while waiting or contexts:
            while waiting and len(contexts) < w.live:
                sid = waiting.pop(0)
                contexts[sid], steps[sid] = system + self._ids(w.doc_tokens), 0
            sid = self.rng.choice(sorted(contexts))
            ctx = contexts[sid]
            ctx += self.generate(list(ctx), sid)
            steps[sid] += 1
            done += 1
            if steps[sid] >= w.steps:
                del contexts[sid]
                self.client.post("/close_session", json={"session_id": sid}).raise_for_status()
            else:
                ctx += self._ids(w.tool_tokens)  # the tool's result
            if w.noise_every and done % w.noise_every == 0:
                self.generate(self._ids(w.noise_tokens), None)
        return self.tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.eviction.sglang_sessions", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--url", required=True)
    p.add_argument("--label", required=True, help="the set-up's name in the results")
    p.add_argument("--out", required=True, help="JSON file; rows are appended")
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    started = time.perf_counter()
    tally = Runner(ns.url, Workload(seed=ns.seed)).run()
    row = tally.row(ns.label, time.perf_counter() - started)
    path = Path(ns.out)
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    rows = [r for r in rows if r["setup"] != ns.label] + [row]
    path.write_text(json.dumps({"workload": asdict(Workload(seed=ns.seed)), "rows": rows}, indent=2) + "\n")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
