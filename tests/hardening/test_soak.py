"""Short soak: `radixagent serve` as a subprocess under 8 concurrent sessions for 20 s (the full run
is `python -m evals.hardening.soak --sessions 32 --minutes 3`)."""

from __future__ import annotations

import json

import pytest

from evals.hardening.soak import SoakConfig, run


@pytest.mark.slow  # a `radixagent serve` subprocess loads the model
def test_short_soak(tmp_path) -> None:
    results = run(SoakConfig(sessions=8, seconds=20, max_total_tokens=4096), tmp_path)
    assert results["requests"] > 0 and results["answered"] > 0, results
    assert results["other"] == 0, results["other_details"]  # answered, 503, or our own hang-ups
    assert results["answered"] + results["rejected_503"] + results["disconnected"] == results["requests"]
    assert results["integrity"]["ok"], results["integrity"]
    assert results["leaked_locks"] == 0 and results["integrity"]["protected_tokens"] == 0
    assert results["server_exit_code"] == 0  # SIGTERM drains and exits cleanly
    assert (tmp_path / "rss.png").stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["ok"]
