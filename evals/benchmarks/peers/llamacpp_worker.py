"""llama.cpp side of the peer benchmark, run with the benchmark venv's python (`.bench-env/`),
never imported by the project: `python llamacpp_worker.py MODEL.gguf --threads 2 --ctx 4096`.

JSON lines on stdin, one JSON line answered on stdout per request:
  {"op": "reset", "ram_cache": bool}         drop the live context (and install a fresh
                                             LlamaRAMCache when ram_cache) -> {"ok": true}
  {"op": "generate", "ids": [...], "max_new_tokens": n}
      -> {"prompt_tokens", "cached_tokens", "ttft_s", "e2e_s", "output_ids"}
Greedy (top_k=1), exactly n tokens (end-of-turn not special). Prompt reuse is llama-cpp-python's
own: `Llama.generate` keeps the live context's longest common prefix, and with a RAM cache the
state whose key shares the longest prefix is restored first, as `Llama._create_completion` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import llama_cpp
from llama_cpp import Llama, LlamaRAMCache


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def restore_from_cache(llm: Llama, ids: list[int]) -> None:
    """`Llama._create_completion`'s prompt-cache lookup (llama-cpp-python 0.3.x)."""
    if llm.cache is None:
        return
    try:
        item = llm.cache[ids]
    except KeyError:
        return
    if common_prefix(item.input_ids.tolist(), ids) > common_prefix(llm._input_ids.tolist(), ids):
        llm.load_state(item)


def generate(llm: Llama, ids: list[int], max_new_tokens: int) -> dict:
    start = time.perf_counter()
    restore_from_cache(llm, ids)
    # What Llama.generate will keep: the live prefix, less one token when it covers the whole prompt.
    reused = min(common_prefix(llm._input_ids.tolist(), ids), len(ids) - 1) if llm.n_tokens else 0
    out, ttft = [], 0.0
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        if not out:
            ttft = time.perf_counter() - start
        out.append(int(token))
        if len(out) >= max_new_tokens:
            break
    e2e = time.perf_counter() - start
    if llm.cache is not None:
        llm.cache[ids + out] = llm.save_state()
    return {
        "prompt_tokens": len(ids),
        "cached_tokens": max(reused, 0),
        "ttft_s": ttft,
        "e2e_s": e2e,
        "output_ids": out,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    args = p.parse_args()
    llm = Llama(
        args.model,
        n_ctx=args.ctx,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    print(json.dumps({"ready": True, "llama_cpp_python": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "reset":
                llm.reset()
                llm.set_cache(LlamaRAMCache() if req.get("ram_cache") else None)
                reply = {"ok": True}
            elif req["op"] == "generate":
                reply = generate(llm, list(req["ids"]), int(req["max_new_tokens"]))
            else:
                reply = {"error": f"unknown op {req['op']!r}"}
        except Exception as exc:  # reported to the benchmark, which stops this peer
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
