"""Decode attention over a stored KV format: read it directly or convert per step?

One decode step's attention for the bundled model's shape (30 layers, 9 query heads over 3 KV
heads, head dim 64) at several context lengths, each layer's K/V distinct (so the step reads
all of it from memory, as the engine does). Variants run interleaved, rep by rep, so machine
load hits them alike; the figure is the fastest rep's step time (the least disturbed on a shared
CPU; medians are in the JSON). `python -m evals.benchmarks.kv_attention`.

  direct   SDPA on the stored dtype itself (bf16/fp16 kernels)
  convert  KVFormat.load into a one-layer float32 scratch, then float32 SDPA
  grouped  SDPA without GQA expansion: each KV head's 3 query heads as 3 query rows (no mask)
  manual   softmax(q K^T) V as two batched matmuls instead of SDPA (one query token)
  folded   int8 only: levels converted, scales folded into the scores and probabilities (manual)
  native   runtime/model/decode_kernel.py: the stored rows read once and converted in registers (what
           the engine runs for decode tokens; `bf16 q` rows: a query exact in bfloat16, as with
           bf16 activations, takes the AVX512-BF16 dot products for bf16 keys)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from runtime.cache.kv_format import KVFormat

LAYERS, KV_HEADS, HEADS, HEAD_DIM = 30, 3, 9, 64


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k.unsqueeze(0), v.unsqueeze(0), enable_gqa=True)


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token: each KV head's G query heads as G query positions of that head (no mask,
    so the same attention without SDPA's GQA expansion); q: [1, KVH, G, hd]."""
    return F.scaled_dot_product_attention(q, k.unsqueeze(0), v.unsqueeze(0))


def _manual(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token as two batched matmuls per KV head group (q pre-scaled, [KVH, G, hd])."""
    return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)), -1), v)


def variants(context: int, seed: int = 0) -> dict[str, Callable[[], None]]:
    """name -> one decode step's attention over `context` positions in every layer."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(LAYERS, KV_HEADS, context, HEAD_DIM, generator=g) * 2
    v = torch.randn(LAYERS, KV_HEADS, context, HEAD_DIM, generator=g)
    q = torch.randn(1, HEADS, 1, HEAD_DIM, generator=g)
    qg = q.view(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM) * HEAD_DIM**-0.5
    q4 = q.view(1, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    out: dict[str, Callable[[], None]] = {
        "float32 direct": lambda: [_sdpa(q, k[i], v[i]) for i in range(LAYERS)],
        "float32 grouped": lambda: [_grouped(q4, k[i], v[i]) for i in range(LAYERS)],
        "float32 manual": lambda: [_manual(qg, k[i], v[i]) for i in range(LAYERS)],
    }
    scratch = torch.empty(KV_HEADS, context, HEAD_DIM), torch.empty(KV_HEADS, context, HEAD_DIM)
    for name in ("bfloat16", "float16", "int8"):
        fmt = KVFormat.resolve(name, torch.float32, torch.float32)
        planes = fmt.alloc(LAYERS, KV_HEADS, context, HEAD_DIM, "cpu")
        for i in range(LAYERS):
            fmt.store(tuple(p[i] for p in planes), k[i], v[i])
        out[f"{name} convert"] = _convert(fmt, planes, q, scratch, _sdpa)
        out[f"{name} convert grouped"] = _convert(fmt, planes, q4, scratch, _grouped)
        out[f"{name} convert manual"] = _convert(fmt, planes, qg, scratch, _manual)
        if not fmt.scaled:
            out[f"{name} direct"] = _direct(planes, q.to(fmt.storage))
        else:
            out["int8 folded"] = _folded(planes, q, scratch)
    out |= _native(k, v, q)
    for name, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        k8, v8 = k.to(dtype), v.to(dtype)
        out[f"{name} convert"] = lambda k8=k8, v8=v8: [
            _sdpa(q, scratch[0].copy_(k8[i]), scratch[1].copy_(v8[i])) for i in range(LAYERS)
        ]
    return out


def _native(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> dict[str, Callable[[], None]]:
    """The engine's decode kernel over each format's pool-layout planes (none where it cannot build)."""
    from runtime.model.decode_kernel import DecodeKernel, KernelUnavailable

    try:
        kernel = DecodeKernel.load()
    except KernelUnavailable as e:
        print(f"native rows skipped: {e}")
        return {}
    out: dict[str, Callable[[], None]] = {}
    context = k.shape[2]
    q1 = q.view(HEADS, HEAD_DIM)
    for name in ("float32", "bfloat16", "float16", "int8"):
        fmt = KVFormat.resolve(name, torch.float32, torch.float32)
        planes = fmt.alloc(LAYERS, KV_HEADS, context, HEAD_DIM, "cpu")
        for i in range(LAYERS):
            fmt.store(tuple(p[i] for p in planes), k[i], v[i])
        plan = kernel.plan(planes, fmt, 0, context, HEADS)
        assert plan is not None

        out[f"{name} native"] = _native_step(kernel, plan, q1)
        if name == "bfloat16":
            out["bfloat16 native, bf16 q"] = _native_step(kernel, plan, q1.bfloat16().float())
    return out


def _native_step(kernel: Any, plan: Any, q: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        for i in range(LAYERS):
            kernel(plan, i, q)

    return step


def _direct(planes: tuple[torch.Tensor, ...], q: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        for i in range(LAYERS):
            _sdpa(q, planes[0][i], planes[1][i])

    return step


def _convert(
    fmt: KVFormat,
    planes: tuple[torch.Tensor, ...],
    q: torch.Tensor,
    scratch: tuple[torch.Tensor, torch.Tensor],
    attend: Callable[..., torch.Tensor],
) -> Callable[[], None]:
    def step() -> None:
        for i in range(LAYERS):
            fmt.load(tuple(p[i] for p in planes), *scratch)
            attend(q, *scratch)

    return step


def _folded(
    planes: tuple[torch.Tensor, ...], q: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor]
) -> Callable[[], None]:
    qg = q.view(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM) * HEAD_DIM**-0.5
    ks, vs = planes[2].squeeze(-1), planes[3].squeeze(-1)  # [layers, kv_heads, context]

    def step() -> None:
        for i in range(LAYERS):
            scratch[0].copy_(planes[0][i])
            scratch[1].copy_(planes[1][i])
            scores = torch.bmm(qg, scratch[0].transpose(1, 2)).mul_(ks[i].unsqueeze(1))
            torch.bmm(torch.softmax(scores, -1).mul_(vs[i].unsqueeze(1)), scratch[1])

    return step


def measure(contexts: tuple[int, ...] = (512, 2048, 4096), reps: int = 15) -> dict[str, dict[str, float]]:
    """Median ms per decode step (all layers) by context and variant."""
    results: dict[str, dict[str, float]] = {}
    for context in contexts:
        steps = variants(context)
        for fn in steps.values():
            fn()  # warm-up: page in, first-call allocations
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(reps):
            for name, fn in steps.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        # the minimum: on a shared CPU it is the least disturbed run (medians are reported too)
        results[str(context)] = {name: min(ts) * 1e3 for name, ts in times.items()}
        results[f"{context} median"] = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    return results


def render(results: dict[str, dict[str, float]]) -> list[str]:
    contexts = [c for c in results if not c.endswith("median")]
    names = list(results[contexts[0]])
    lines = [
        "| variant | " + " | ".join(f"{c} tokens: ms/step (vs float32)" for c in contexts) + " |",
        "|---|" + "---|" * len(contexts),
    ]
    for name in names:
        cells = [
            f"{results[c][name]:.2f} ({results[c]['float32 direct'] / results[c][name]:.2f}x)"
            for c in contexts
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.kv_attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 4096])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--md", default=None, help="also write a markdown report here (docs/results/bench-kv-attention.md)"
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    results = measure(tuple(args.contexts), args.reps)
    print(f"torch threads {torch.get_num_threads()}, load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("\n".join(render(results)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"threads": torch.get_num_threads(), "loadavg": load, "ms_per_step": results}, fh, indent=2
            )
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(markdown(results, torch.get_num_threads(), load, args.reps))
    return 0


def markdown(results: dict[str, dict[str, float]], threads: int, load: float, reps: int) -> str:
    ctx = [c for c in results if not c.endswith("median")]

    def span(name: str) -> str:
        return "/".join(f"{results[c]['float32 direct'] / results[c][name]:.2f}x" for c in ctx)

    summary = (
        f"decode attention over {'/'.join(ctx)} tokens of context (30 layers) vs float32 SDPA: reading bf16 "
        f"directly (SDPA in bf16) {span('bfloat16 direct')}, converting per layer into a float32 scratch "
        f"{span('bfloat16 convert')}; int8 converted {span('int8 convert')}; fp8_e4m3 converted "
        f"{span('fp8_e4m3 convert')}; the native decode kernel {span('bfloat16 native')} (bf16), "
        f"{span('int8 native')} (int8), {span('float32 native')} (float32): the engine runs the native kernel "
        "for decode tokens (--attention-backend native_cpu, the default where it builds), converts for prefill "
        "chunks and with torch_native, and refuses fp8."
        if "bfloat16 native" in results[ctx[0]]
        else f"{span('fp8_e4m3 convert')}: the engine converts (bf16/fp16/int8) and refuses fp8."
    )
    return "\n".join(
        [
            "# KV formats: read directly or convert per step (`python -m evals.benchmarks.kv_attention`)",
            "",
            f"Command: `python -m evals.benchmarks.kv_attention --threads {threads} --reps {reps} --md "
            f"docs/results/bench-kv-attention.md`; 1-minute load average {load:.1f} on 2 cores (a shared machine: "
            "the fastest of the interleaved reps is reported; compare ratios within a column).",
            "",
            f"Summary: {summary}",
            "",
            *render(results),
            "",
            "Each variant reads one decode step's K/V for the bundled model's shape (9 query heads over 3 KV "
            "heads, head dim 64) from 30 distinct layers. `convert` is the engine's path "
            "(runtime/cache/kv_format.py: KVFormat.load, then float32 SDPA); `grouped` and `manual` are "
            "alternatives to SDPA for one query token; `folded` applies the int8 scales to scores and "
            "probabilities instead of to K/V. `native` is runtime/model/decode_kernel.py (the engine's decode "
            "path by default): each stored row read once and converted in registers, split over (kv head, "
            "256 keys) tasks on torch's OpenMP pool.",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
