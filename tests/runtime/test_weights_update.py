"""`update_weights_from_disk`: other weights, the whole cache invalidated, and no request that ran
under the old weights inserting into the new tree. The second weights are the bundled model with
noise added, saved by this test as an HF folder in a temporary directory."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from runtime.errors import InvalidRequest  # noqa: E402
from runtime.model import files as model_files  # noqa: E402
from runtime.server import ServerArgs, create_app  # noqa: E402
from tests.support.server_util import LiveServer, wait_idle  # noqa: E402

pytestmark = pytest.mark.slow
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"


@pytest.fixture(scope="module")
def perturbed_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled weights plus seeded noise (a third of each tensor's spread), as an HF folder."""
    loaded = model_files.load(None, torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in loaded.hf_model.parameters():
            noise = torch.randn(param.shape, generator=generator) * float(param.float().std()) * 0.3
            param.add_(noise.to(param.dtype))
    folder = tmp_path_factory.mktemp("perturbed-smollm2")
    model = loaded.hf_model
    # de-quantized to float32 already: drop the GGUF quantizer so that save_pretrained accepts it
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder, safe_serialization=True)
    loaded.tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture()
def sibling(engine: Any) -> Iterator[Any]:
    """Its own pool, tree and (after an update) weights; the shared engine is never changed."""
    other = engine.sibling(max_total_tokens=4096)
    yield other
    other.shutdown()


def test_new_weights_change_outputs_and_leave_no_stale_hit(sibling: Any, perturbed_path: str) -> None:
    before = sibling.generate(prompt=PROMPT, sampling_params=GREEDY)
    hit = sibling.generate(prompt=PROMPT, sampling_params=GREEDY)
    assert hit["meta_info"]["cached_tokens"] > 0 and hit["text"] == before["text"]
    result = sibling.update_weights_from_disk(perturbed_path)
    assert result["success"] is True and result["num_paused_requests"] == 0
    assert sibling.weights_version == 1
    after = sibling.generate(prompt=PROMPT, sampling_params=GREEDY)
    assert after["meta_info"]["cached_tokens"] == 0  # the old weights' KV is gone
    assert after["output_ids"] != before["output_ids"]
    again = sibling.generate(prompt=PROMPT, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] > 0 and again["output_ids"] == after["output_ids"]
    sibling.check_integrity()


def test_request_in_flight_during_the_update_never_reaches_the_new_tree(
    engine: Any, sibling: Any, perturbed_path: str
) -> None:
    """A request running when the update comes finishes under the old weights (here: is aborted);
    a request queued behind the update runs on the new weights with no hit on the old KV."""
    runaway_rid = "in-flight-during-update"
    box: dict[str, Any] = {}

    def run(key: str, fn: Any, *args: Any, **kwargs: Any) -> threading.Thread:
        thread = threading.Thread(target=lambda: box.__setitem__(key, fn(*args, **kwargs)), daemon=True)
        thread.start()
        return thread

    runaway = {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}
    t_runaway = run("runaway", sibling.generate, prompt=PROMPT, sampling_params=runaway, rid=runaway_rid)
    _wait(lambda: sibling.get_cache_stats()["running"] == 1)
    t_update = run("update", sibling.update_weights_from_disk, perturbed_path)
    _wait(lambda: sibling.scheduler.swap is not None, timeout_s=180)  # loaded; waiting for the runaway
    queued_prompt = PROMPT + " Madrid. The capital of Germany is"
    t_queued = run("queued", sibling.generate, prompt=queued_prompt, sampling_params=GREEDY)
    _wait(lambda: sibling.get_cache_stats()["queue_depth"] == 1)
    time.sleep(0.5)
    assert sibling.get_cache_stats()["running"] == 1  # the queued request waits for the swap
    assert sibling.abort_request(runaway_rid) == 1
    for thread in (t_runaway, t_update, t_queued):
        thread.join(180)
    assert box["runaway"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert box["update"]["success"] is True and box["update"]["num_paused_requests"] == 1
    queued = box["queued"]["meta_info"]
    assert queued["cached_tokens"] == 0  # the runaway's prompt and output KV did not survive the swap
    # the queued request ran on the new weights: the same output as a cold run on them
    cold = sibling.generate(prompt=queued_prompt, sampling_params=GREEDY, prefix_cache=False)
    assert box["queued"]["output_ids"] == cold["output_ids"]
    old = engine.generate(prompt=queued_prompt, sampling_params=GREEDY, prefix_cache=False)
    assert old["output_ids"] != cold["output_ids"]
    wait_idle(sibling)
    sibling.check_integrity()


def test_unusable_weights_are_refused_and_change_nothing(sibling: Any, tmp_path: Path) -> None:
    out = sibling.generate(prompt=PROMPT, sampling_params=GREEDY)
    with pytest.raises(InvalidRequest, match="model_path"):
        sibling.update_weights_from_disk(str(tmp_path / "missing"))
    with pytest.raises(InvalidRequest, match="load_format"):
        sibling.update_weights_from_disk(model_files.default_model_path(), load_format="safetensors")
    assert sibling.weights_version == 0
    again = sibling.generate(prompt=PROMPT, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] > 0 and again["output_ids"] == out["output_ids"]


def test_http_update_weights_from_disk(sibling: Any, perturbed_path: str, tmp_path: Path) -> None:
    with LiveServer(create_app(sibling, ServerArgs(enable_metrics=True))) as live:
        body = {"text": PROMPT, "sampling_params": GREEDY}
        first = httpx.post(f"{live.url}/generate", json=body, timeout=120).json()
        assert (
            httpx.post(f"{live.url}/generate", json=body, timeout=120).json()["meta_info"]["cached_tokens"]
            > 0
        )
        url = f"{live.url}/update_weights_from_disk"
        bad = httpx.post(url, json={"model_path": str(tmp_path / "nope")}, timeout=60)
        assert (
            bad.status_code == 400
            and bad.json()["success"] is False
            and "model_path" in bad.json()["message"]
        )
        for field, value in (("flush_cache", False), ("is_async", True), ("manifest", {})):
            r = httpx.post(url, json={"model_path": perturbed_path, field: value}, timeout=60)
            assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
        r = httpx.post(url, json={"model_path": perturbed_path, "weight_version": "v2"}, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["success"] is True and r.json()["num_paused_requests"] == 0 and r.json()["message"]
        info = httpx.get(f"{live.url}/get_model_info").json()
        assert info["weight_version"] == "v2" and info["model_path"] == perturbed_path
        after = httpx.post(f"{live.url}/generate", json=body, timeout=120).json()
        assert after["meta_info"]["cached_tokens"] == 0
        assert after["output_ids"] != first["output_ids"]
    sibling.check_integrity()


def _wait(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
