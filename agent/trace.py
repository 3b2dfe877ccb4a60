"""Per-model-call trace for the SDK: `StepRecord`, the JSONL writer and reader, and the session
ledger that computes `ideal_cached_tokens`, prefix breaks and `miss` causes.

The record, writer and ledger live in runtime/ (runtime/trace/record.py, runtime/trace/ledger.py) so
that `serve --trace-dir` writes the same trace with the same code; they are re-exported here.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

from runtime.trace.ledger import MISS_CAUSES, SessionLedger, StepAccounting, StepEvent, common_prefix
from runtime.trace.record import StepRecord, TraceWriter

log = logging.getLogger(__name__)

__all__ = [
    "MISS_CAUSES",
    "PrefixBreakWarning",
    "SessionLedger",
    "StepAccounting",
    "StepEvent",
    "StepRecord",
    "TraceWriter",
    "common_prefix",
    "read_trace",
    "warn_prefix_break",
]


class PrefixBreakWarning(UserWarning):
    """A prompt stopped extending its branch's previous prompt without a declared rollback."""


def read_trace(path: str | Path) -> list[StepRecord]:
    """Every complete step of a trace. A torn last line (the writer was killed mid-write) is
    skipped with a warning; a bad line anywhere else is corruption and raises ValueError."""
    # split at "\n" only: splitlines also cuts at U+2028, U+2029 and U+0085, which the writer
    # leaves raw inside strings (ensure_ascii=False), and a prompt holding one read as corruption
    text = Path(path).read_text(encoding="utf-8")
    lines = [line for line in text.split("\n") if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(StepRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError) as exc:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a trace record ({exc})") from exc
            warnings.warn(
                f"{path}:{number}: incomplete last line skipped (the run stopped mid-write)", stacklevel=2
            )
    return records


def warn_prefix_break(record: StepRecord) -> None:
    brk = record.prefix_break or {}
    message = (
        f"prefix break in session {record.session_id} branch {record.branch} step {record.step}: "
        f"at {brk.get('unit', 'tokens')} offset {brk.get('offset')} expected {brk.get('expected')} "
        f"got {brk.get('got')}"
    )
    log.warning(message)
    warnings.warn(message, PrefixBreakWarning, stacklevel=3)
