"""Tenant isolation through timing: can tenant B tell from its own TTFT that tenant A cached a prompt?

    python -m evals.hardening.isolation --url http://127.0.0.1:30000 --samples 10 [--out DIR]

Per sample, tenant A (cache_salt "tenant-a") caches a fresh long prompt P; then, in random order,
A sends P again, B sends P, and B sends a fresh prompt Q of the same length (B's two probes use
salts of their own, so B's own history cannot explain a hit).
Each request asks for one token, so its wall time is its TTFT as the client sees it. With salts, B's
time on P must look like B's time on Q (ratio of medians ~1.0) while A's repeat is much faster.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import httpx

WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "heath", "indigo", "jade"]


class IsolationResult(NamedTuple):
    samples: int
    a_repeat_ttft_s: list[float]
    b_on_a_prompt_ttft_s: list[float]
    b_fresh_ttft_s: list[float]
    b_on_a_prompt_cached_tokens: int  # summed: 0 when isolated
    a_repeat_cached_tokens: int  # summed: > 0 when the cache works
    ratio_b_on_a_vs_fresh: float  # median(B on A's prompt) / median(B fresh): ~1.0 when isolated
    a_speedup: float  # median(B fresh) / median(A repeat)

    def as_dict(self) -> dict[str, object]:
        return self._asdict()


def long_prompt(tag: str, words: int) -> str:
    rng = random.Random(tag)
    return f"[{tag}] " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\nAnswer:"


def ttft(client: httpx.Client, text: str, salt: str) -> tuple[float, int]:
    body = {"text": text, "cache_salt": salt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    started = time.perf_counter()
    r = client.post("/generate", json=body)
    elapsed = time.perf_counter() - started
    r.raise_for_status()
    return elapsed, int(r.json()["meta_info"]["cached_tokens"])


def measure(url: str, samples: int = 10, words: int = 400, seed: int = 0) -> IsolationResult:
    rng = random.Random(seed)
    run = f"{seed}-{time.time_ns()}"  # fresh prompts on every run, even against a warm server
    a_rep: list[float] = []
    b_on_a: list[float] = []
    b_fresh: list[float] = []
    cross = own = 0
    with httpx.Client(base_url=url, timeout=300) as client:
        ttft(client, long_prompt(f"warmup-{run}", words), "tenant-w")
        for i in range(samples):
            p, q = long_prompt(f"a-{run}-{i}", words), long_prompt(f"b-{run}-{i}", words)
            ttft(client, p, "tenant-a")  # A caches P
            # B's probes each get an empty namespace of their own: any hit would be a cross-tenant hit
            probes = [
                ("a", p, "tenant-a"),
                ("b_on_a", p, f"tenant-b-{run}-{i}-p"),
                ("b_fresh", q, f"tenant-b-{run}-{i}-q"),
            ]
            rng.shuffle(probes)
            for name, text, salt in probes:
                t, cached = ttft(client, text, salt)
                if name == "a":
                    a_rep.append(t)
                    own += cached
                elif name == "b_on_a":
                    b_on_a.append(t)
                    cross += cached
                else:
                    b_fresh.append(t)
    fresh = statistics.median(b_fresh)
    return IsolationResult(
        samples,
        a_rep,
        b_on_a,
        b_fresh,
        cross,
        own,
        ratio_b_on_a_vs_fresh=statistics.median(b_on_a) / fresh,
        a_speedup=fresh / statistics.median(a_rep),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.hardening.isolation", description=__doc__.splitlines()[0]
    )
    p.add_argument("--url", required=True, help="a radixagent serve (or SGLang) base URL")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--words", type=int, default=400)
    p.add_argument("--out", type=Path, default=None)
    ns = p.parse_args(argv)
    result = measure(ns.url, ns.samples, ns.words)
    text = json.dumps(result.as_dict(), indent=2)
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "isolation.json").write_text(text)
    print(text)
    isolated = result.b_on_a_prompt_cached_tokens == 0 and 0.8 <= result.ratio_b_on_a_vs_fresh <= 1.25
    return 0 if isolated else 1


if __name__ == "__main__":
    raise SystemExit(main())
