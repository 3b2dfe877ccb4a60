"""What the task runners write and report: JSONL lines flushed as they come, a progress bar, and
the statistics of their tables (percentiles, hit rate)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO


class JsonlSink:
    """Appends one JSON object per line and flushes it at once: a partial run keeps its lines."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._file: TextIO = path.open("w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of `values`; None when there are none."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return data[low] + (data[high] - data[low]) * (pos - low)


def hit_rate(records: Sequence[Any]) -> float:
    """cached / prompt tokens over trace records (0.0 when nothing was sent)."""
    prompt = sum(r.prompt_tokens for r in records)
    return sum(r.cached_tokens for r in records) / prompt if prompt else 0.0


@contextmanager
def progress_bar(enabled: bool, description: str, total: int) -> Iterator[Any]:
    """A rich progress bar (a callable `advance()`), or a no-op when disabled."""
    if not enabled:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
