"""A script using the Python API exits cleanly (code 0) whatever the engine's worker is doing when
the interpreter finalizes: just finished a long request (it frees a large KV buffer then), inside
a running request's forward, or streaming to an iterator left open. Before the fix these aborted
with "terminate called without an active exception" (exit 134); see runtime/engine/scheduler.py.

Each case is a fresh subprocess (each loads the model). RADIXAGENT_EXIT_REPEATS (default 1) runs
each case that many times, for checking by hand that it is not flaky.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SCRIPT = Path(__file__).with_name("exit_script.py")
ROOT = Path(__file__).resolve().parents[2]
REPEATS = int(os.environ.get("RADIXAGENT_EXIT_REPEATS", "1"))


@pytest.mark.parametrize("mode", ["after-long", "during-request", "during-stream"])
def test_script_exits_cleanly(mode: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    for attempt in range(REPEATS):
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        tail = proc.stderr[-2000:]
        assert "ending" in proc.stdout, (attempt, proc.stdout, tail)  # it got as far as the end
        assert proc.returncode == 0, (attempt, proc.returncode, tail)
        assert "terminate called" not in proc.stderr, (attempt, tail)
