"""Where a decode step's time goes, phase by phase, at 1 / 4 / 16 requests, beside each phase's roof.

The default engine (int4wo-32 weights, bf16 KV, the exact fast path) decodes one token for each
of n requests at the throughput section's context (a ~256-token essay plus chat and question,
each request its own). Measured on the engine's own kernels with the requests' real K/V, each
phase alone over the model's layers (the fastest of `repeats`, calls straight to the kernel):

- int4 matmuls: qkv, o, gate_up and down of every layer (csrc/int4_linear.c);
- attention: rope, K/V store, attention and merge of every layer (csrc/decode_attention.c
  `decode_layer`);
- lm_head: the int8 head over the vocabulary;
- rest of the forward: the whole forward (`LlamaModel.forward`, fastest of `repeats`) minus the
  above: norms, silu, residual adds, embedding, plans and their Python;
- outside the forward: the engine's step period with n concurrent streams (the median gap between
  a stream's tokens while all n decode, in the bench's throughput measure) minus the forward:
  sampling, stop checks, result events, and what the n streaming threads cost the step.

Phases timed alone find the caches cold (a read of EVICT_BYTES before each call), as in a step
where the other phases' bytes pass through first; in the step some of a phase's bytes can still be
cached, so "rest of the forward" (never below 0) is a lower bound. The probes move with this
machine's load like every figure: the roofs are this run's, not constants.

Roofs, from this run's own probes: a phase cannot take less than its bytes at the measured read
bandwidth, nor less than its FLOPs at its kernel's own rate on many rows (the int4 kernel on 512
rows, the lm_head on 64). Their sum is the step of a design that runs the phases one after another
at their roofs; n times the 1-request sum over the n-request sum is the aggregate speed-up such a
design could reach. `python -m evals.benchmarks.step_phases --md docs/results/bench-step-phases.md`
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: the phases timed alone, in step order
PHASES = ("int4 matmuls", "attention", "lm_head")
#: the matrices of an int4 layer, in step order
MATRICES = ("qkv", "o", "gate_up", "down")
#: bytes read between timed phase calls: past the last-level caches of the CPUs we run on
EVICT_BYTES = 256 * 2**20


class NoNativeStep(RuntimeError):
    """This machine or engine has no native int4 decode step to take apart (no AVX512-BF16, or
    weights that are not int4)."""


@dataclass(frozen=True, slots=True)
class PhasesConfig:
    counts: tuple[int, ...] = (1, 4, 16)
    #: each request's essay (the bench's session_prompt_tokens), before chat and question
    doc_tokens: int = 256
    repeats: int = 15
    #: tokens per stream in the step-period measurement
    new_tokens: int = 64
    threads: int | None = None

    def __post_init__(self) -> None:
        if not self.counts or min(self.counts) < 1 or self.repeats < 1 or self.new_tokens < 4:
            raise ValueError("counts >= 1, repeats >= 1 and new_tokens >= 4 are required")


def _best(fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Seconds of the fastest of `repeats` calls, after one warm-up; `before` runs untimed ahead of each."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@dataclass(slots=True)
class _Bench:
    """The engine's model and kernel with every request's K/V prefilled outside the engine's pool."""

    engine: Any
    kvs: list[Any]
    repeats: int
    #: read before each phase's call, untimed: in a step every phase finds the caches full of the
    #: others' bytes (the lm_head's 28 MB or a few requests' K/V would otherwise stay in L3)
    evict: Any

    @classmethod
    def of(cls, engine: Any, docs: Sequence[list[int]], repeats: int) -> _Bench:
        from runtime.cache.seq_kv import SeqKV
        from runtime.engine.build import kv_format
        from runtime.model.model import Segment

        model, kernel = engine.model, engine.scheduler.decode_kernel
        if kernel is None or kernel.int4_fn is None or not getattr(model, "_int4_layers", None):
            raise RuntimeError(
                "step phases need the native int4 decode path (an AVX512-BF16 CPU, int4 weights)"
            )
        fmt = kv_format(engine.config, model)
        kvs = []
        for ids in docs:
            kv = SeqKV.empty(model.cfg, len(ids) + 1, fmt, "cpu")
            model.forward([Segment(kv, list(ids))], engine.scheduler.deterministic, kernel)
            kvs.append(kv)
        import torch

        return cls(engine, kvs, repeats, torch.ones(EVICT_BYTES // 4))

    @property
    def model(self) -> Any:
        return self.engine.model

    @property
    def kernel(self) -> Any:
        return self.engine.scheduler.decode_kernel

    def segments(self, n: int) -> list[Any]:
        from runtime.model.model import Segment

        return [Segment(kv, [42]) for kv in self.kvs[:n]]

    def forward_s(self, n: int) -> float:
        def step() -> None:
            self.model.forward(self.segments(n), self.engine.scheduler.deterministic, self.kernel)
            for kv in self.kvs[:n]:
                kv.length -= 1  # the next repeat decodes the same position

        return _best(step, self.repeats)

    def int4_s(self, n: int) -> float:
        import torch

        mats = [getattr(layer, name) for layer in self.model.layers for name in MATRICES]
        xs = [
            torch.randn(n, m.tiles.numel() * 2 // (m.scales_zeros.shape[0] * 16)).to(torch.bfloat16)
            for m in mats
        ]
        outs = [torch.empty(n, m.scales_zeros.shape[0] * 16, dtype=torch.bfloat16) for m in mats]
        threads, fn = torch.get_num_threads(), self.kernel.int4_fn
        calls = [
            (
                x.data_ptr(),
                m.tiles.data_ptr(),
                m.scales_zeros.data_ptr(),
                y.data_ptr(),
                n,
                y.shape[1],
                x.shape[1],
                m.group,
            )
            for m, x, y in zip(mats, xs, outs, strict=True)
        ]
        return self._timed(lambda: [fn(*args, threads) for args in calls])

    def _timed(self, fn: Callable[[], object]) -> float:
        return _best(fn, self.repeats, self.evict.sum)

    def attention_s(self, n: int) -> float:
        import torch

        from runtime.model.decode_kernel import ACTS

        cfg, segs = self.model.cfg, self.segments(n)
        plans = self.model._decode_plans(segs, self.kernel)
        if plans is None:
            raise RuntimeError("the decode kernel took no plan for these requests")
        width = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
        h = (torch.randn(n, width) * 0.5).to(torch.bfloat16)
        pos = torch.tensor([s.kv.length for s in segs])
        cos, sin = self.model.cos[pos].contiguous(), self.model.sin[pos].contiguous()
        out = torch.empty(n, cfg.heads * cfg.head_dim, dtype=torch.bfloat16)
        args = (
            ACTS[torch.bfloat16],
            h.data_ptr(),
            h.stride(0),
            cos.data_ptr(),
            sin.data_ptr(),
            out.data_ptr(),
        )
        fn = self.kernel.layer_fn
        # each call stores a K/V row at the next position, past what the requests hold: no K/V read changes
        return self._timed(lambda: [fn(plans.array, n, li, *args) for li in range(cfg.layers)])

    def lm_head_s(self, n: int, dtype: Any = None) -> float:
        """The head on n bf16 rows (what a step gives it), or on `dtype` rows: float32 rows take
        the float32-FMA kernel that bf16 rows took before the pair dot products."""
        import torch

        head = self.model.lm_head
        x = torch.randn(n, self.model.cfg.hidden).to(torch.bfloat16).to(dtype or torch.bfloat16)
        return self._timed(lambda: self.kernel.int8_linear(x, head.weight, head.scales32))


def _roofs(bench: _Bench, n: int, bw: float, int4_gflops: float, head_gflops: float) -> dict[str, float]:
    """Each phase's least seconds at n requests: its bytes at `bw` GB/s, its FLOPs at its kernel's rate."""
    from evals.benchmarks.limits import weights_per_token

    model = bench.model
    layer_macs, head_macs = weights_per_token(model.cfg)
    int4_bytes = sum(getattr(layer, m).nbytes for layer in model.layers for m in MATRICES)
    head_bytes = model.lm_head.weight.nbytes + model.lm_head.scales32.nbytes
    kv_bytes = sum(kv.length + 1 for kv in bench.kvs[:n]) * bench.engine.kv_bytes_per_token
    return {
        "int4 matmuls": max(int4_bytes / (bw * 1e9), 2 * n * layer_macs / (int4_gflops * 1e9)),
        "attention": kv_bytes / (bw * 1e9),
        "lm_head": max(head_bytes / (bw * 1e9), 2 * n * head_macs / (head_gflops * 1e9)),
    }


def _head_gflops(bench: _Bench, rows: int = 64) -> float:
    cfg = bench.model.cfg
    return 2 * rows * cfg.vocab_size * cfg.hidden / bench.lm_head_s(rows) / 1e9


def _phases(engine: Any, docs: Sequence[list[int]], cfg: PhasesConfig) -> dict[str, Any]:
    """Per request count: the forward, each phase and each roof (seconds), and the probes."""
    import torch

    from evals.benchmarks.limits import bandwidth_gb_s, layer_gflops

    bench = _Bench.of(engine, docs, cfg.repeats)
    probes = {
        "bandwidth_gb_s": bandwidth_gb_s(),
        "int4_gflops": layer_gflops(engine.model),
        "lm_head_gflops": _head_gflops(bench),
    }
    rows = {}
    for n in cfg.counts:
        phases = {
            "int4 matmuls": bench.int4_s(n),
            "attention": bench.attention_s(n),
            "lm_head": bench.lm_head_s(n),
        }
        forward = bench.forward_s(n)
        rows[str(n)] = {
            "forward_s": forward,
            "phases_s": {**phases, "rest of the forward": max(0.0, forward - sum(phases.values()))},
            "roofs_s": _roofs(bench, n, *probes.values()),
            "context_tokens": [kv.length + 1 for kv in bench.kvs[:n]],
            "lm_head_float32_rows_s": bench.lm_head_s(n, torch.float32),
        }
    return {"probes": probes, "rows": rows}


def _periods(engine: Any, docs: Sequence[list[int]], cfg: PhasesConfig) -> dict[str, float]:
    """The step period with n concurrent streams: the median token gap of the bench's throughput
    measure (its median run of 3), after one warm-up run."""
    from evals.benchmarks.bench_measure import throughput_sweep

    throughput_sweep(engine, docs, [1], cfg.new_tokens)
    rows = throughput_sweep(engine, docs, list(cfg.counts), cfg.new_tokens, repeats=3)["rows"]
    return {str(r["sessions"]): r["token_gap_p50_s"] for r in rows}


def measure(cfg: PhasesConfig) -> dict[str, Any]:
    from evals.benchmarks.bench import QUESTIONS
    from evals.benchmarks.bench_measure import essay_documents, qa_prompts
    from evals.benchmarks.prefill import wait_retired
    from runtime import Engine
    from runtime.engine.threads import in_fresh_thread

    engine = Engine(num_threads=cfg.threads)
    try:
        tok = engine.tokenize
        essays = essay_documents(tok, max(cfg.counts), cfg.doc_tokens)
        docs = [qa_prompts(tok, essay, QUESTIONS[:1]).prompt(0) for essay in essays]
        periods = _periods(engine, docs, cfg)
        wait_retired([engine])  # the kernels below run on a thread of their own (threads.py)
        results = in_fresh_thread(lambda: _phases(engine, docs, cfg), "bench-step-phases")
    finally:
        engine.shutdown()
    for n, row in results["rows"].items():
        row["period_s"] = periods[n]
        row["phases_s"]["outside the forward"] = max(0.0, periods[n] - row["forward_s"])
    return results


def _ratio(rows: dict[str, Any], n: str, key: Callable[[dict[str, Any]], float]) -> float:
    one, many = key(rows[next(iter(rows))]), key(rows[n])
    return int(n) * one / many if many else 0.0


def _span(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def markdown(results: dict[str, Any], machine: str) -> str:
    rows, probes = results["rows"], results["probes"]
    counts = list(rows)
    lines = [
        "# Where a decode step goes (`python -m evals.benchmarks.step_phases`)",
        "",
        f"{machine}. Default engine (int4wo-32, bf16 KV, exact fast path); n requests of "
        f"{_span(rows[counts[-1]]['context_tokens'])} tokens each, one new token. "
        f"Probes: read bandwidth {probes['bandwidth_gb_s']:.1f} GB/s, int4 kernel {probes['int4_gflops']:.0f} GFLOP/s "
        f"(512 rows), lm_head kernel {probes['lm_head_gflops']:.0f} GFLOP/s (64 rows). ms per step; in brackets the "
        "phase's roof (its bytes at the bandwidth or its FLOPs at its kernel's rate, the longer) and the roof over "
        "the measured time.",
        "",
        "| phase | " + " | ".join(f"{n} request{'s' * (n != '1')}" for n in counts) + " |",
        "|---|" + "---|" * len(counts),
    ]
    names = [*PHASES, "rest of the forward", "outside the forward"]
    for name in names:
        cells = []
        for n in counts:
            ms, roof = rows[n]["phases_s"][name] * 1e3, rows[n]["roofs_s"].get(name)
            cells.append(
                f"{ms:.2f}" + ("" if roof is None else f" ({roof * 1e3:.2f}, {roof * 1e3 / ms:.0%})")
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| step period | " + " | ".join(f"{rows[n]['period_s'] * 1e3:.2f}" for n in counts) + " |")
    lines.append(
        "| sum of the roofs | "
        + " | ".join(f"{sum(rows[n]['roofs_s'].values()) * 1e3:.2f}" for n in counts)
        + " |"
    )
    if all("lm_head_float32_rows_s" in rows[n] for n in counts):
        lines.append(
            "| lm_head, float32 rows (the float32-FMA kernel bf16 rows took before) | "
            + " | ".join(f"{rows[n]['lm_head_float32_rows_s'] * 1e3:.2f}" for n in counts)
            + " |"
        )
    measured = [f"{_ratio(rows, n, lambda r: r['period_s']):.2f}x at {n}" for n in counts[1:]]
    at_roofs = [f"{_ratio(rows, n, lambda r: sum(r['roofs_s'].values())):.2f}x at {n}" for n in counts[1:]]
    lines += [
        "",
        f"Summary: aggregate decode over 1 request, measured (step periods): {', '.join(measured)}; with every phase at "
        f"its roof, one after another, and nothing else costing time: {', '.join(at_roofs)}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from evals.benchmarks.prefill import machine_line

    p = argparse.ArgumentParser(
        prog="python -m evals.benchmarks.step_phases",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--counts", type=int, nargs="+", default=list(PhasesConfig().counts))
    p.add_argument("--repeats", type=int, default=PhasesConfig().repeats)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--md", default=None, help="also write a markdown report here (docs/results/bench-step-phases.md)"
    )
    args = p.parse_args(argv)
    try:
        cfg = PhasesConfig(counts=tuple(args.counts), repeats=args.repeats, threads=args.threads)
    except ValueError as e:
        p.error(str(e))
    machine = machine_line(cfg.threads)
    results = measure(cfg)
    text = markdown(results, machine)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, **results}, fh, indent=2)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
