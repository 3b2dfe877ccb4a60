"""The accuracy/TTFT-vs-head-length sweep on a scripted backend: rows, report section, chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evals.suites.backends import EvalSetup
from evals.suites.headlen import SweepConfig, chart, markdown, run_head_sweep
from tests.support.fake_backend import ReplyBackend


def searches_then_copies(prompt: str, _params: dict[str, Any]) -> str:
    """Searches, then copies the first observed sentence's last word."""
    last = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if last.startswith("Observation"):
        return '{"answer":"' + last.split("] ", 1)[1].split(".")[0].split()[-1] + '"}'
    return '{"tool":"search_document","arguments":{"query":"code door"}}'


def test_sweep_rows_grow_the_head_and_keep_cached_ttft_flat(tmp_path: Path) -> None:
    # TTFT ~ uncached tokens, of a prefix cache over the prompts' text
    backend = ReplyBackend(searches_then_copies, cache=True, prefill_s_per_token=1e-4)
    setup = EvalSetup("scripted", "m", "machine", "flag", cached=backend, uncached=backend)
    sweep = run_head_sweep(setup, SweepConfig(counts=(0, 2, 8), questions=2))
    rows = sweep["rows"]
    assert [r["examples"] for r in rows] == [0, 2, 8] and sweep["questions"] == 2
    heads = [r["head_tokens"] for r in rows]
    assert heads[0] < heads[1] < heads[2]
    uncached = [r["uncached"]["ttft_p50_s"] for r in rows]
    cached = [r["cached"]["ttft_p50_s"] for r in rows]
    assert uncached[0] < uncached[1] < uncached[2]  # every example is prefilled again, every call
    assert max(cached) < uncached[0] and cached[2] <= 2 * cached[0]  # cached: flat
    assert all(r["cached"]["accuracy"] == r["uncached"]["accuracy"] for r in rows)
    assert backend.flushes == 3  # each cached pass starts cold
    assert any(c.get("prefix_cache") is False for c in backend.calls)
    text = "\n".join(markdown(sweep))
    assert "head length" in text and text.count("\n| ") >= 4
    assert chart(sweep, tmp_path / "head_length.png").exists()
    assert markdown({}) == [] and chart({}, tmp_path / "none.png") is None
