"""The tier over HTTP: SGLang's flags, `meta_info.cached_tokens_details`, Prometheus counters."""

from __future__ import annotations

import httpx
import pytest
from test_engine_tier import GREEDY, evict_all, stored_len  # noqa: E402

from runtime.server import ServerArgs, create_app  # noqa: E402
from runtime.server.args import build_parser, engine_config  # noqa: E402
from tests.support.server_util import LiveServer  # noqa: E402


def test_flags_map_to_engine_config(tmp_path):
    ns = build_parser().parse_args(
        [
            "--enable-hierarchical-cache",
            "--hicache-storage-dir",
            str(tmp_path),
            "--hicache-storage-backend",
            "redis",
            "--disable-hicache-prefetch",
        ]
    )
    cfg = engine_config(ns)
    assert cfg["enable_hierarchical_cache"] and "hicache_size" not in cfg  # None: the file default
    assert cfg["hicache_storage_backend"] == "redis" and cfg["hicache_prefetch"] is False
    assert cfg.get("hicache_write_policy") is None  # resolved per backend when the tier is built
    assert "enable_hierarchical_cache" not in engine_config(build_parser().parse_args([]))


@pytest.mark.slow
def test_generate_reports_storage_tokens_and_metrics(engine, tmp_path):
    from tests.runtime.conftest import essay_text

    prompt = engine.tokenize(essay_text())[:300]
    eng = engine.sibling(
        enable_hierarchical_cache=True, hicache_storage_dir=str(tmp_path), max_total_tokens=2048
    )
    try:
        with LiveServer(create_app(eng, ServerArgs(enable_metrics=True))) as live:
            body = {"input_ids": prompt, "sampling_params": GREEDY}
            first = httpx.post(f"{live.url}/generate", json=body, timeout=120).json()
            assert (
                first["meta_info"]["cached_tokens"] == 0 and "cached_tokens_details" not in first["meta_info"]
            )
            evict_all(eng)
            hit = httpx.post(f"{live.url}/generate", json=body, timeout=120).json()
            assert hit["meta_info"]["cached_tokens"] == stored_len(prompt)
            assert hit["meta_info"]["cached_tokens_details"]["storage"] == stored_len(prompt)
            assert hit["output_ids"] == first["output_ids"]
            metrics = httpx.get(f"{live.url}/metrics", timeout=30).text
            assert f"radixagent:tier_loaded_tokens_total {float(stored_len(prompt))}" in metrics
            assert "radixagent:tier_write_queue_bytes 0.0" in metrics  # drained by evict_all
    finally:
        eng.shutdown()
