"""evals/benchmarks/prefill.py: cold prefill by prompt length, default weights against float32."""

from __future__ import annotations

from evals.benchmarks.prefill import PrefillConfig, cold_ttft_s, markdown


def test_cold_ttft_empties_the_cache_first(engine):
    ids = list(range(1000, 1200))
    params = {"temperature": 0, "max_new_tokens": 1}
    engine.generate(input_ids=ids, sampling_params=params)  # now cached, all but the last token
    assert (
        engine.generate(input_ids=ids, sampling_params=params)["meta_info"]["cached_tokens"] == len(ids) - 1
    )
    assert cold_ttft_s(engine, ids) > 0  # raises if any prompt token came from the cache
    engine.check_integrity()


def test_report_names_each_length_and_the_ratio():
    cfg = PrefillConfig(lengths=(512, 2000), repeats=2)
    results = {
        "int4wo-32 (default)": {
            "512": {"prompt_tokens": 512, "ttft_s": [0.5, 0.4], "prefill_tok_s": 1280.0},
            "2000": {"prompt_tokens": 2000, "ttft_s": [2.0, 2.5], "prefill_tok_s": 1000.0},
        },
        "float32": {
            "512": {"prompt_tokens": 512, "ttft_s": [1.0, 1.1], "prefill_tok_s": 512.0},
            "2000": {"prompt_tokens": 2000, "ttft_s": [4.0, 4.2], "prefill_tok_s": 500.0},
        },
    }
    text = markdown(results, cfg, "AMD EPYC, 2 cores")
    assert "| int4wo-32 (default) | 1,280 (0.40 s) | 1,000 (2.00 s) |" in text
    assert "Summary: int4wo-32 (default) / float32, prefill: 2.50x at 512, 2.00x at 2000" in text
