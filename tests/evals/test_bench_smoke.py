"""`make bench` and `make bench-gpu` at tiny sizes: the measurement functions run and the results
have the shape docs/results/bench.json and the report rely on (numbers are not checked)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from evals.benchmarks import bench, bench_gpu
from evals.benchmarks.peers.report import render_report

pytestmark = pytest.mark.slow

REUSE_KEYS = {
    "engine",
    "shared_prefix_tokens",
    "prompt_tokens",
    "ttft_cold_s",
    "ttft_cached_s",
    "ttft_cold_p50_s",
    "ttft_cached_p50_s",
    "cached_tokens",
    "speedup_ttft",
    "prefill_tok_s",
    "decode_tok_s",
    "decode_context_tokens",
    "decode_tokens",
    "outputs_identical",
}
THROUGHPUT_KEYS = {
    "sessions",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "decode_tok_s",
    "token_gap_p50_s",
    "output_tok_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "wall_s",
    "decode_tok_s_runs",
}
HIT_KEYS = {
    "engine",
    "sessions",
    "rounds",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "hit_rate",
    "ttft_later_rounds_p50_s",
}


def test_bench_sections_on_the_engine(engine, tmp_path):
    cfg = replace(bench.QUICK, peers=False)
    results = bench.run_bench(engine, cfg, say=lambda msg: None)
    json.dumps(results)  # the results file is plain JSON
    reuse = results["prefix_reuse"]
    assert set(reuse) == REUSE_KEYS
    assert reuse["outputs_identical"] == 1.0  # fp32: cached and cold greedy outputs match
    assert min(reuse["cached_tokens"]) >= reuse["shared_prefix_tokens"]
    rows = results["throughput"]["rows"]
    assert [r["sessions"] for r in rows] == list(cfg.sessions)
    assert all(
        set(r) == THROUGHPUT_KEYS and r["completion_tokens"] == r["sessions"] * cfg.session_new_tokens
        for r in rows
    )
    assert "decode_2_over_1" in results["throughput"]
    # each round's ratio is that round's 2-session run over its own 1-session run
    one, two = (r["decode_tok_s_runs"] for r in rows)
    assert len(one) == len(two) == cfg.session_rounds
    assert results["throughput"]["decode_2_over_1_rounds"] == [b / a for a, b in zip(one, two, strict=True)]
    hits = results["multi_session"]["radixagent"]
    assert set(hits) == HIT_KEYS and hits["requests"] == cfg.hit_docs * 2 and hits["hit_rate"] > 0.3
    assert results["ratios"]["cached_ttft_vs_llama_cpp"] is None  # peers off: no ratio, no made-up number
    quant = results["quantized"]  # the same sections again with int4 weights, from a second engine
    assert quant["torchao_config"] == "int4wo-32" and set(quant["prefix_reuse"]) == REUSE_KEYS
    assert quant["prefix_reuse"]["outputs_identical"] == 1.0
    assert results["ratios"]["quantized_cached_ttft_vs_llama_cpp"] is None
    text = render_report(results)
    assert "## Ratios and targets" in text and "| radixagent (ours), float32 |" in text
    assert text.count("Aggregate decode over 1 session, round by round: 2 sessions: ") == 2  # float32, int4
    assert "| int4wo-32: single-stream decode" in text and "| radixagent (ours), int4wo-32 |" in text
    lim = quant["limits"]  # beside the figures: the bandwidth and peak they are bounded by
    assert lim["bandwidth_gb_s"] > 0 and lim["sgemm_gflops"] > 0 and lim["prefill_limit_tok_s"] > 0
    assert (
        set(lim["aggregate_limit_tok_s"]) == {str(n) for n in cfg.sessions} and lim["decode_limit_tok_s"] > 0
    )
    bench.write_report(results, tmp_path / "benchmarks.md")
    report = (tmp_path / "benchmarks.md").read_text()
    assert "## Physical limits (radixagent bfloat16 int4wo-32" in report
    # the sessions' limits at their own context, each beside the measured 1-session rate
    assert f"| aggregate decode, {max(cfg.sessions)} sessions at {lim['session_context']} tokens" in report
    assert "x the measured 1 session; " in report and "x the 1-session limit)" in report
    engine.check_integrity()


class _RecordingEngine:
    """Streams `max_new_tokens` one-token chunks and records each run's session count, so the
    sweep's order is visible (the real engine's runs are in the test above)."""

    def __init__(self) -> None:
        self.requests: list[int] = []  # per run (a flush starts one): its request count

    def flush_cache(self) -> None:
        self.requests.append(0)

    def generate_stream(self, input_ids, sampling_params):
        self.requests[-1] += 1
        for i in range(1, sampling_params["max_new_tokens"] + 1):
            yield {"output_ids": [7] * i, "meta_info": {"ttft": 0.001, "cached_tokens": 0}}


def test_session_sweep_interleaves_the_counts_round_by_round():
    from evals.benchmarks.bench_measure import throughput_sweep

    engine = _RecordingEngine()
    sweep = throughput_sweep(engine, [[1, 2, 3]] * 4, [1, 4], new_tokens=3, repeats=3)
    assert engine.requests == [1, 4, 1, 4, 1, 4]  # not 1, 1, 1, 4, 4, 4: drift falls on both counts
    assert [r["sessions"] for r in sweep["rows"]] == [1, 4]
    assert all(len(r["decode_tok_s_runs"]) == 3 for r in sweep["rows"])
    assert len(sweep["decode_4_over_1_rounds"]) == 3 and "decode_4_over_1" in sweep


@pytest.mark.parametrize("flag", ["--session-rounds", "--repeats"])
def test_bench_refuses_a_count_below_one_by_name_before_loading(flag, capsys):
    assert bench.main(["--quick", "--no-peers", flag, "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench: ") and flag.removeprefix("--").replace("-", "_") in err


def test_bench_gpu_tiny_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench_gpu.main(["--device", "cpu", "--tiny"]) == 0
    summary = json.loads((tmp_path / "gpu.json").read_text())
    (model,) = summary["models"]
    assert model["name"] == "tiny" and set(model["prefix_reuse"]) == REUSE_KEYS
    assert model["prefix_reuse"]["outputs_identical"] == 1.0
    assert [r["sessions"] for r in model["throughput"]["rows"]] == [1, 4]
    assert "## GPU figures" in "\n".join(bench_gpu.gpu_markdown(summary))


def test_llama_cpp_peer_without_its_env_says_how_to_set_it_up(tmp_path):
    from evals.benchmarks.peers.llamacpp import LlamaCppRunner, PeerUnavailable

    with pytest.raises(PeerUnavailable, match="make bench-peers-setup"):
        LlamaCppRunner("model.gguf", env=tmp_path)
