"""Abort latency: `Engine.abort_request` sent -> the request's KV released (its caller returns right
after the release), while it decodes and while its prompt is being prefilled.

An abort is applied at the next step boundary, so the latency is at most one forward step: a decode
step, or a prefill chunk (`chunked_prefill_size` tokens). Reported next to the step time measured in
the same run, as a ratio. Each abort is sent after a delay spread over one decode step, so it lands
mid-forward as a client's would. `python -m evals.benchmarks.abort_latency [--trials 5] [--out FILE.json]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from runtime import Engine

RUNAWAY = {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}


def _until(condition: Any, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.001)


def _running(engine: Engine, rid: str) -> Any:
    with engine.scheduler.lock:
        return next((r for r in engine.scheduler.running if r.rid == rid), None)


def one_abort(engine: Engine, ids: list[int], rid: str, phase: str, delay_s: float) -> float:
    """Seconds from abort_request to the generate call returning (its KV is released by then)."""
    box: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: box.update(
            out=engine.generate(input_ids=ids, sampling_params=RUNAWAY, rid=rid, prefix_cache=False)
        )
    )
    thread.start()
    if phase == "decode":
        _until(lambda: (r := _running(engine, rid)) is not None and len(r.output_ids) >= 3)
    else:  # mid-prefill: the first chunk has been computed, the prompt is not complete
        _until(lambda: (r := _running(engine, rid)) is not None and r.kv is not None and r.kv.length > 0)
    time.sleep(delay_s)  # land the abort anywhere in a step, not just at its boundary
    started = time.perf_counter()
    engine.abort_request(rid)
    thread.join()
    latency = time.perf_counter() - started
    assert box["out"]["meta_info"]["finish_reason"]["type"] == "abort"
    engine.check_integrity()
    assert engine.get_cache_stats()["running"] == 0
    return latency


def step_time(engine: Engine, ids: list[int], tokens: int = 32) -> float:
    out = engine.generate(
        input_ids=ids, sampling_params={**RUNAWAY, "max_new_tokens": tokens}, prefix_cache=False
    )
    meta = out["meta_info"]
    return (meta["e2e_latency"] - meta["ttft"]) / (tokens - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--prefill-tokens", type=int, default=3000, help="prompt length for mid-prefill aborts")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    engine = Engine(max_total_tokens=20000)
    short = engine.tokenize("Tell me a long story about a lighthouse keeper and the sea.")
    long = (engine.tokenize("The quick brown fox jumps over the lazy dog. ") * args.prefill_tokens)[
        : args.prefill_tokens
    ]
    results: dict[str, Any] = {"decode_step_s": step_time(engine, short)}
    for phase, ids in (("decode", short), ("prefill", long)):
        # delays spread over one decode step, so aborts arrive mid-forward as a client's would
        delays = [results["decode_step_s"] * (i + 0.5) / args.trials for i in range(args.trials)]
        samples = [one_abort(engine, ids, f"{phase}-{i}", phase, d) for i, d in enumerate(delays)]
        results[phase] = {"p50_s": statistics.median(samples), "max_s": max(samples), "samples_s": samples}
    results["chunked_prefill_size"] = engine.config.chunked_prefill_size
    results["decode_p50_over_step"] = results["decode"]["p50_s"] / results["decode_step_s"]
    engine.shutdown()
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
