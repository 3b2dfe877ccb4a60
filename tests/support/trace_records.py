"""A minimal trace record as the writer stores it (one step of one run), for the trace readers' tests."""

from __future__ import annotations

from typing import Any


def step_dict(**fields: Any) -> dict[str, Any]:
    """One step's record as a dict; `fields` override its values."""
    return {
        "run_id": "r",
        "session_id": "s",
        "branch": 0,
        "step": 0,
        "kind": "act",
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "ideal_cached_tokens": 0,
        "completion_tokens": 2,
        "ttft_s": 0.1,
        "latency_s": 0.2,
        "finish_reason": "stop",
        "prefix_break": None,
        "tool": None,
        **fields,
    }
