"""`radixagent serve --kv-cache-dtype`: refused values exit with a message naming the flag's
field before any model loads; a live server over an int8-KV engine reports the format and its
bytes per token in /get_server_info and /metrics, and serves with cache hits."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from runtime.server import ServerArgs, create_app
from runtime.server.args import build_parser, engine_config
from runtime.server.cli import main as serve_main
from tests.support.server_util import LiveServer


@pytest.mark.parametrize("value", ["fp8_e4m3", "fp8_e5m2", "int3", "bf32"])
def test_serve_refuses_unsupported_kv_cache_dtypes_before_loading(value, capsys):
    assert serve_main(["--kv-cache-dtype", value, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "kv_cache_dtype" in err and value in err


def test_the_flag_reaches_the_engine_config():
    ns = build_parser().parse_args(["--kv-cache-dtype", "int8"])
    assert engine_config(ns)["kv_cache_dtype"] == "int8"
    assert engine_config(build_parser().parse_args([]))["kv_cache_dtype"] == "auto"


def test_attention_backend_flag(capsys):
    ns = build_parser().parse_args(["--attention-backend", "torch_native"])
    assert engine_config(ns)["attention_backend"] == "torch_native"
    assert "attention_backend" not in engine_config(build_parser().parse_args([]))  # the engine picks
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--attention-backend", "flashinfer"])
    assert "--attention-backend: invalid choice: 'flashinfer'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def int8_server(engine) -> Iterator[tuple[LiveServer, object]]:
    sibling = engine.sibling(kv_cache_dtype="int8", max_total_tokens=4096)
    try:
        with LiveServer(create_app(sibling, ServerArgs(enable_metrics=True))) as live:
            yield live, sibling
    finally:
        sibling.shutdown()


@pytest.mark.slow
def test_server_info_and_metrics_report_the_kv_format(int8_server):
    live, sibling = int8_server
    text = "The int8 KV server test: a prompt long enough to be cached and hit on the second request."
    params = {"temperature": 0, "max_new_tokens": 4}
    first = httpx.post(
        f"{live.url}/generate", json={"text": text, "sampling_params": params}, timeout=120
    ).json()
    again = httpx.post(
        f"{live.url}/generate", json={"text": text, "sampling_params": params}, timeout=120
    ).json()
    assert again["meta_info"]["cached_tokens"] > 10 and again["output_ids"] == first["output_ids"]
    info = httpx.get(f"{live.url}/get_server_info", timeout=30).json()
    assert info["kv_cache_dtype"] == "int8" and info["engine_config"]["kv_cache_dtype"] == "int8"
    assert info["attention_backend"] == "native_cpu"  # decode reads the int8 levels directly
    stats = info["cache_stats"]
    assert stats["kv_bytes_per_token"] == 12240  # 30 layers x 3 heads x (64 levels + a float32 scale) x K,V
    assert stats["pool_capacity_bytes"] == 4096 * 12240
    metrics = httpx.get(f"{live.url}/metrics", timeout=30).text
    assert 'radixagent:kv_cache_dtype_info{kv_cache_dtype="int8"} 1.0' in metrics
    assert "radixagent:kv_bytes_per_token 12240.0" in metrics
    assert stats["bytes_in_use"] == stats["tokens_in_use"] * 12240


def test_log_level_is_honoured_after_the_dispatcher_configured_logging():
    """`radixagent serve` goes through runtime/cli.py, which installs a WARNING config first."""
    import logging

    from runtime.cli import main as radixagent

    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    try:
        assert (
            radixagent(["serve", "--log-level", "debug", "--kv-cache-dtype", "fp8_e4m3", "--port", "0"]) == 2
        )
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
