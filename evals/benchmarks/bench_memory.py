"""KV memory under load: does what `--max-total-tokens` promises hold?

8 concurrent requests with distinct ~2k-token prompts, replaced as they finish, for `--seconds`
on a 40,000-token pool (the default bf16 KV: ~880 MiB, the bytes 20,000 float32 tokens took). Samples, every 50 ms, the engine's own accounting of K/V bytes held
(`kv_bytes_held`: pool + per-request + parked) and the process RSS. Reports the peak of each:
accounting over pool bytes (must stay <= pool + 10%) and peak RSS minus RSS after load (the pool
is resident after load, so growth is memory outside it; must stay <= 10% of the pool).

    python -m evals.benchmarks.bench_memory --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from dataclasses import asdict, dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@dataclass(frozen=True, slots=True)
class MemoryResult:
    seconds: float
    requests: int
    pool_tokens: int
    pool_bytes: int
    peak_kv_bytes_held: int
    rss_after_load: int
    peak_rss: int

    @property
    def held_over_pool(self) -> float:
        return self.peak_kv_bytes_held / self.pool_bytes

    @property
    def rss_growth_over_pool(self) -> float:
        return (self.peak_rss - self.rss_after_load) / self.pool_bytes

    def lines(self) -> list[str]:
        mib = 2**20
        return [
            f"pool {self.pool_tokens} tokens = {self.pool_bytes / mib:.0f} MiB; {self.requests} requests "
            f"in {self.seconds:.0f} s",
            f"peak KV bytes held (engine accounting): {self.peak_kv_bytes_held / mib:.0f} MiB "
            f"= {self.held_over_pool:.1%} of the pool (limit 110%)",
            f"peak RSS - RSS after load: {(self.peak_rss - self.rss_after_load) / mib:.0f} MiB "
            f"= {self.rss_growth_over_pool:.1%} of the pool (limit 10%)",
        ]


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(100, vocab) for _ in range(n)]  # distinct: nothing to share


class _Peaks:
    """Samples the engine's KV accounting and the process RSS every 50 ms, keeping the peaks."""

    def __init__(self, engine, pool_bytes: int, rss_after_load: int) -> None:
        self.engine, self.pool_bytes, self.rss_after_load = engine, pool_bytes, rss_after_load
        self.held, self.rss, self.done = pool_bytes, rss_after_load, 0
        self.stop = threading.Event()

    def sample(self) -> None:
        ticks = 0
        while not self.stop.wait(0.05):
            s = self.engine.get_cache_stats()
            self.held = max(self.held, int(s.get("kv_bytes_held", s["pool_capacity_bytes"])))
            self.rss = max(self.rss, rss_bytes())
            ticks += 1
            if ticks % 300 == 0:  # progress every ~15 s, so a cut-short run still says something
                held, grown = self.held / self.pool_bytes, (self.rss - self.rss_after_load) / self.pool_bytes
                print(
                    f"{ticks / 20:.0f}s: {self.done} done, peak held {held:.1%}, RSS growth {grown:.1%}",
                    flush=True,
                )

    def client(self, seed: int, vocab: int, prompt_tokens: int) -> None:
        rng = random.Random(seed)
        params = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
        while not self.stop.is_set():
            self.engine.generate(input_ids=_prompt(rng, vocab, prompt_tokens), sampling_params=params)
            self.done += 1


def measure(
    seconds: float, concurrency: int = 8, prompt_tokens: int = 2000, pool: int = 40_000
) -> MemoryResult:
    from runtime import Engine

    engine = Engine(max_total_tokens=pool, max_running_requests=concurrency)
    vocab = engine.model_info["vocab_size"]
    pool_bytes = int(engine.get_cache_stats()["pool_capacity_bytes"])
    peaks = _Peaks(engine, pool_bytes, rss_bytes())
    started = time.perf_counter()
    threads = [threading.Thread(target=peaks.sample)] + [
        threading.Thread(target=peaks.client, args=(i, vocab, prompt_tokens)) for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)
    peaks.stop.set()
    engine.abort_request(abort_all=True)  # the clients' last requests stop at the next step
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    engine.shutdown()
    return MemoryResult(elapsed, peaks.done, pool, pool_bytes, peaks.held, peaks.rss_after_load, peaks.rss)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    result = measure(args.seconds)
    print("\n".join(result.lines()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                asdict(result)
                | {
                    "held_over_pool": result.held_over_pool,
                    "rss_growth_over_pool": result.rss_growth_over_pool,
                },
                f,
                indent=2,
            )
    return 0 if result.held_over_pool <= 1.10 and result.rss_growth_over_pool <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
